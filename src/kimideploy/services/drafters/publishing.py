"""`kimideploy drafter publish NAME --cluster CLUSTER`: a Job on the cluster that holds the drafter
pushes it to the registry as one OCI artifact; then kimideploy.yaml pins it by digest (the
drafter's source, status `trained`, every file's sha256, its held-out figures), changing nothing
else in the file. A drafter the registry does not know yet gets an entry made from its lineage.
Nothing is written to the file unless the push succeeded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimideploy.cluster.session import ClusterSession
from kimideploy.config import yaml_edit
from kimideploy.config.drafters import held_out_from_lineage
from kimideploy.config.loading import LoadedProject, load_project_text
from kimideploy.errors import KimiDeployError
from kimideploy.plan.asks import PublishAsk
from kimideploy.plan.model import PlanRequest
from kimideploy.services.reporting import Reporter
from kimideploy.services.runs import batch_runs


@dataclass(frozen=True)
class Published:
    name: str
    reference: str
    files: dict[str, str]
    held_out: dict[int, float] | None
    created: bool
    """The config had no entry for the drafter; one was made from its lineage."""


def publish_drafter(
    session: ClusterSession,
    loaded: LoadedProject,
    name: str,
    cluster: str | None,
    *,
    to: str | None,
    reporter: Reporter,
    poll_s: float = 2.0,
    overrides: tuple[str, ...] = (),
) -> Published:
    request = PlanRequest("publish", cluster, name, overrides, ask=PublishAsk(to=to))
    result = batch_runs.publish_result(session, loaded, request, reporter, poll_s=poll_s)
    return pin_published(loaded.path, name, result)


def pin_published(config: Path, name: str, result: dict[str, Any]) -> Published:
    """Write the published artifact into the config (under the config's edit lock)."""
    repository, _, digest = str(result["reference"]).rpartition("@")
    files = dict(result.get("files") or {})
    lineage = dict(result.get("lineage") or {})
    try:
        held_out = held_out_from_lineage(lineage)
    except ValueError:
        # The push is done and its digest is pinned below; figures of the wrong shape are not
        # (the publish pod refuses such a lineage before it pushes, so only a hand-made result
        # gets here).
        held_out = None
    oci = {"repository": repository, "digest": digest, "files": files}
    values: dict[str, Any] = {"source": {"oci": oci}, "status": "trained"}
    if "model.safetensors" in files:
        values["sha256"] = files["model.safetensors"]
    if held_out is not None:
        values["held_out"] = held_out.model_dump(exclude_none=True)
    with yaml_edit.editing(config):
        text = config.read_text()
        current = load_project_text(text, config).project
        created = name not in current.drafters
        trained_at = None if created else current.eagle_drafter(name).source.path
        if trained_at is not None:
            # Kept: where it was trained, so that no `run train` writes that name again.
            values["source"] = {"path": trained_at, "oci": oci}
        if created:
            text = yaml_edit.add_entry(text, ("drafters",), name, {**entry(lineage), **values})
        else:
            text = yaml_edit.set_values(text, ("drafters", name), values)
        load_project_text(text, config)  # never write a file that no longer validates
        yaml_edit.replace_text(config, text)
    lengths = dict(held_out.mean_acceptance_length) if held_out else None
    return Published(name, str(result["reference"]), files, lengths, created)


def entry(lineage: dict[str, Any]) -> dict[str, Any]:
    """A registry entry from a drafter's lineage (what the train workload wrote beside it)."""
    ids = lineage.get("eagle_aux_hidden_state_layer_ids")
    if not ids or not lineage.get("trained_for"):
        raise KimiDeployError(
            "the drafter has no registry entry and its lineage does not say its layers and "
            "target; kimideploy.yaml was not changed",
            hint="add the drafter to kimideploy.yaml by hand, then publish it again",
        )
    dataset = lineage.get("dataset") or {}
    record_lineage = {"trained_for": lineage["trained_for"]}
    if lineage.get("trained_for_revision"):
        record_lineage["trained_for_revision"] = lineage["trained_for_revision"]
    if dataset.get("fingerprint"):
        record_lineage["dataset"] = f"fingerprint {dataset['fingerprint']}"
    if lineage.get("run_id"):
        record_lineage["training_run"] = lineage["run_id"]
    return {
        "description": f"trained by kimideploy run {lineage.get('run_id')}; published",
        "num_speculative_tokens": int(lineage.get("num_speculative_tokens") or 3),
        "aux_layer_ids": list(ids),
        "layer_id_convention": "vllm",
        "draft_vocab_size": int(lineage.get("draft_vocab_size") or 32000),
        "lineage": record_lineage,
    }
