"""The training side of an extracted dataset: is it the right one, and its samples as batches.

The checks run before any GPU work: the team once trained a drafter on features of the wrong model
at (probably) the wrong layers, and found out after a 25-minute load (docs/reference/domain.md §4).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimideploy.config.drafters import to_vllm_layer_ids
from kimideploy.config.specs import TrainSpec
from kimideploy.formats.bounded_io import UnreadableFileError, read_json_object
from kimideploy.workloads.runtime import BadInputError

MANIFEST_KIND = "kimideploy.hidden-states.v1"


@dataclass(frozen=True)
class Dataset:
    files: list[Path]
    manifests: list[dict[str, Any]]

    @property
    def samples(self) -> int:
        return len(self.files)

    def lineage(self) -> dict[str, Any]:
        first = self.manifests[0]
        return {
            "shards": len(self.manifests),
            "samples": self.samples,
            "layer_ids": first["layer_ids"],
            "convention": first["convention"],
            "vllm_layer_ids": first["vllm_layer_ids"],
            "dtype": first["dtype"],
            "model": first["model"],
            "tokenizer_sha256": first.get("tokenizer_sha256"),
            "tokens": sum(int(m.get("tokens", 0)) for m in self.manifests),
        }


def open_dataset(root: Path) -> Dataset:
    """Every finished shard (one with a manifest) and its sample files, in a stable order."""
    manifests, files = [], []
    for manifest_path in sorted(root.glob("shard-*/manifest.json")):
        try:
            manifest = read_json_object(manifest_path)
        except UnreadableFileError as exc:
            raise BadInputError(
                f"{exc}: the shard's manifest cannot be read",
                hint="run `kimideploy run extract` again: it rewrites the manifest of a shard",
            ) from exc
        if manifest.get("kind") != MANIFEST_KIND:
            raise BadInputError(f"{manifest_path}: not a kimideploy hidden-states manifest")
        manifests.append(manifest)
        files += sorted(manifest_path.parent.glob("*.safetensors"))
    if not manifests:
        unfinished = sorted(p.name for p in root.glob("shard-*"))
        detail = f" (unfinished shards: {', '.join(unfinished)})" if unfinished else ""
        raise BadInputError(
            f"no finished extraction shard under {root}{detail}; run `kimideploy run extract` "
            "(it resumes) before training"
        )
    return Dataset(files, manifests)


def check_dataset(manifests: list[dict[str, Any]], spec: TrainSpec) -> list[str]:
    """Refuse features that do not fit the drafter; returns notes worth logging."""
    notes = []
    wanted = spec.layers
    for manifest in manifests:
        where = f"shard {manifest.get('shard')}"
        ids, convention = list(manifest["layer_ids"]), manifest["convention"]
        vllm_ids = to_vllm_layer_ids(ids, convention)
        if vllm_ids != list(wanted.vllm_ids):
            raise BadInputError(
                f"{where}: the features are of layers {ids} ({convention} convention) = "
                f"{vllm_ids} in vLLM's, but drafter {spec.drafter} reads layers {wanted.ids} "
                f"({wanted.convention}) = {wanted.vllm_ids} in vLLM's; they are different layers. "
                "Extract again with the drafter's layer ids (`kimideploy run extract`)"
            )
        if convention != wanted.convention:
            if not spec.convert_layer_convention:
                raise BadInputError(
                    f"{where}: the features are written in the {convention} convention {ids}, the "
                    f"drafter in the {wanted.convention} convention {wanted.ids}; they name the "
                    f"same layers ({vllm_ids} in vLLM's convention). Set "
                    "train.convert_layer_convention: true to accept the conversion explicitly"
                )
            notes.append(
                f"{where}: features in the {convention} convention {ids} and drafter in the "
                f"{wanted.convention} convention {wanted.ids} name the same layers; the drafter "
                f"is written with vLLM's {vllm_ids} (train.convert_layer_convention)"
            )
        model = manifest.get("model", {})
        if (model.get("repo"), model.get("revision")) != (spec.target.repo, spec.target.revision):
            raise BadInputError(
                f"{where}: the features come from {model.get('repo')}@{model.get('revision')}, "
                f"the drafter is for {spec.target.repo}@{spec.target.revision}; a drafter must "
                "be trained on its own target's hidden states"
            )
        if int(manifest["hidden_size"]) != spec.target.hidden_size:
            raise BadInputError(
                f"{where}: hidden size {manifest['hidden_size']} is not the target's "
                f"{spec.target.hidden_size}"
            )
    return notes


def epoch_order(indexes: list[int], seed: int, epoch: int, rank: int, *, world: int) -> list[int]:
    """This rank's training samples for one epoch: a seeded shuffle, dealt round-robin across
    ranks, cut to the same length on every rank (DDP needs the same number of steps
    everywhere). Held-out samples are not in `indexes`."""
    order = list(indexes)
    random.Random(f"{seed}-{epoch}").shuffle(order)
    per_rank = len(order) // world
    return order[rank::world][:per_rank]


def batches(order: list[int], batch_size: int) -> Iterator[list[int]]:
    for start in range(0, len(order) - batch_size + 1, batch_size):
        yield order[start : start + batch_size]


def steps_per_epoch(samples: int, world: int, batch_size: int) -> int:
    return (samples // world) // batch_size
