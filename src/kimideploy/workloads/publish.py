"""publish: push a drafter (or a conversations dataset) from its volume to the registry as one OCI
artifact, and print its digest and every file's sha256 for `kimideploy drafter publish` (`data
publish`) to pin in kimideploy.yaml. A drafter's files are checked first (the same checks as
`drafter check` reads there: a config.json, weights that parse); a dataset must carry its
fingerprint and every sample must parse, and its shards' writer locks are held while it is
pushed, so a datagen run still writing it is refused instead of published half-written."""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from kimideploy.config.drafters import held_out_from_lineage
from kimideploy.config.specs import PublishSpec
from kimideploy.formats.bounded_io import UnreadableFileError, read_json_object
from kimideploy.formats.drafter_files import LINEAGE_FILE
from kimideploy.formats.safetensors_files import read_headers
from kimideploy.workloads import dataset_record, oci_artifacts
from kimideploy.workloads.conversations import iter_samples
from kimideploy.workloads.runtime import EXIT_OK, BadInputError, emit, log
from kimideploy.workloads.writer_lock import WriterLock


def run(spec: PublishSpec) -> int:
    folder = Path(spec.source_dir)
    if not folder.is_dir():
        raise BadInputError(
            f"{folder} does not exist on this cluster's volume",
            hint="publish from the cluster that trained it (--cluster CLUSTER)",
        )
    lineage: dict[str, Any] = {}
    dataset: dict[str, Any] = {}
    notes = dict(spec.annotations)
    with ExitStack() as held:
        if spec.kind == "drafter":
            _check_drafter(folder)
            lineage = _lineage(folder)
            notes.update(_lineage_annotations(lineage))
        else:
            for shard in sorted(folder.glob("shard-*")):
                held.enter_context(WriterLock(shard, f"{shard} (being published)"))
            dataset = _dataset(folder)
            notes.update(
                {
                    "io.kimideploy.dataset-fingerprint": dataset["fingerprint"],
                    "io.kimideploy.samples": str(dataset["samples"]),
                }
            )
        started = time.monotonic()
        try:
            pushed = oci_artifacts.push(
                folder,
                spec.kind,
                spec.repository,
                spec.tag,
                annotations=notes,
                access=spec.registry,
            )
        except oci_artifacts.RegistryError as exc:
            log(f"error: {exc}")
            log(f"hint: {exc.hint}")
            return exc.exit_code
    log(
        f"pushed {folder} as {pushed.reference} ({pushed.size:,} bytes in "
        f"{time.monotonic() - started:.0f} s)"
    )
    emit(
        {
            "event": "result",
            "stage": "publish",
            "kind": spec.kind,
            "name": spec.name,
            **oci_artifacts.describe(pushed),
            "annotations": notes,
            "lineage": _lineage_summary(lineage),
            "dataset": dataset,
        }
    )
    return EXIT_OK


def _dataset(folder: Path) -> dict[str, Any]:
    """What `data publish` pins: the fingerprint (id and fields) and the samples it holds."""
    record = dataset_record.read(folder)
    if record is None or not record.get("id"):
        raise BadInputError(
            f"{folder} has no fingerprint.json: what the conversations were made from is "
            "unknown, so they cannot be published for another cluster to trust",
            hint="publish conversations a kimideploy datagen run wrote",
        )
    samples = sum(1 for _ in iter_samples(folder))  # every line parses, or a named refusal
    if samples == 0:
        raise BadInputError(f"{folder} holds no conversations yet", hint="run datagen first")
    return {
        "fingerprint": record["id"],
        "made_from": record.get("fields") or {},
        "samples": samples,
    }


def _check_drafter(folder: Path) -> None:
    if not (folder / "config.json").is_file():
        raise BadInputError(f"{folder} has no config.json: not a drafter checkpoint")
    tensors, broken = read_headers(folder)
    if broken or not tensors:
        raise BadInputError(f"{folder}: weights cannot be read ({'; '.join(broken) or 'none'})")


def _lineage(folder: Path) -> dict[str, Any]:
    """The drafter's kimideploy-lineage.json; a drafter without one is published without its
    training facts (said in the log)."""
    try:
        lineage = read_json_object(folder / LINEAGE_FILE)
    except UnreadableFileError as exc:
        log(f"no readable lineage ({exc}): publishing without training facts")
        return {}
    try:
        held_out_from_lineage(lineage)  # before the push: after it, nothing can be undone
    except ValueError as exc:
        raise BadInputError(
            f"{folder / LINEAGE_FILE}: {exc}; nothing was pushed",
            hint="the lineage was edited after training wrote it: restore it, or remove its "
            "held_out to publish the drafter without held-out figures",
        ) from exc
    return lineage


def _lineage_annotations(lineage: dict[str, Any]) -> dict[str, str]:
    held_out = lineage.get("held_out") or {}
    dataset = lineage.get("dataset") or {}
    found = {
        "io.kimideploy.dataset-fingerprint": str(dataset.get("fingerprint") or ""),
        "io.kimideploy.held-out.mean-acceptance-length": json.dumps(
            held_out.get("mean_acceptance_length") or {}, sort_keys=True
        ),
        "io.kimideploy.training-run": str(lineage.get("run_id") or ""),
    }
    return {k: v for k, v in found.items() if v not in ("", "{}")}


def _lineage_summary(lineage: dict[str, Any]) -> dict[str, Any]:
    """What `drafter publish` needs to write a registry entry the config lacks."""
    keys = (
        "drafter",
        "run_id",
        "trained_for",
        "trained_for_revision",
        "eagle_aux_hidden_state_layer_ids",
        "draft_vocab_size",
        "num_speculative_tokens",
        "held_out",
        "selected_checkpoint",
        "base_drafter",
    )
    summary = {key: lineage.get(key) for key in keys if key in lineage}
    dataset = lineage.get("dataset") or {}
    summary["dataset"] = {
        "fingerprint": dataset.get("fingerprint"),
        "samples": dataset.get("samples"),
    }
    return summary
