"""`kimideploy data publish NAME --cluster CLUSTER`: a Job on the cluster that generated them pushes
its pipeline's conversations (with their fingerprint record) to the registry as one OCI artifact;
then kimideploy.yaml records `datasets.NAME` (pinned by digest, with the fingerprint and what it
was made from), changing nothing else in the file. Nothing is written unless the push succeeded.
Another cluster's pipeline takes them with `workloads.train.conversations: NAME`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimideploy.cluster.session import ClusterSession
from kimideploy.config import yaml_edit
from kimideploy.config.fingerprints import fingerprint_id
from kimideploy.config.loading import LoadedProject, load_project_text
from kimideploy.errors import KimiDeployError
from kimideploy.plan.asks import PublishAsk
from kimideploy.plan.model import PlanRequest
from kimideploy.services.reporting import Reporter
from kimideploy.services.runs import batch_runs


@dataclass(frozen=True)
class PublishedData:
    name: str
    reference: str
    fingerprint: str
    samples: int
    files: int
    created: bool


def publish_dataset(
    session: ClusterSession,
    loaded: LoadedProject,
    name: str,
    cluster: str,
    *,
    to: str | None,
    reporter: Reporter,
    poll_s: float = 2.0,
    overrides: tuple[str, ...] = (),
) -> PublishedData:
    ask = PublishAsk(to=to, dataset=name)
    request = PlanRequest("publish", cluster, None, overrides, ask=ask)
    result = batch_runs.publish_result(session, loaded, request, reporter, poll_s=poll_s)
    return pin_dataset(loaded.path, name, cluster, result)


def pin_dataset(config: Path, name: str, cluster: str, result: dict[str, Any]) -> PublishedData:
    """`datasets.NAME` from the publish pod's result (under the config's edit lock)."""
    dataset = dict(result.get("dataset") or {})
    if not dataset.get("fingerprint"):
        raise KimiDeployError(
            "the publish pod reported no dataset fingerprint; kimideploy.yaml was not changed",
            hint="publish conversations a kimideploy datagen run wrote",
        )
    made_from = dataset.get("made_from")
    if not isinstance(made_from, dict) or fingerprint_id(made_from) != dataset["fingerprint"]:
        # The id comes from fingerprint.json on the volume, which any pod that can write the
        # datasets volume can rewrite: what is pinned must be the hash of the fields it names.
        raise KimiDeployError(
            f"the published dataset's fingerprint id {str(dataset['fingerprint'])[:40]!r} is not "
            "the fingerprint of the fields it says it was made from; kimideploy.yaml was not "
            "changed",
            hint="its fingerprint.json was edited after datagen wrote it: regenerate the "
            "conversations (`kimideploy run datagen`) and publish again",
        )
    repository, _, digest = str(result["reference"]).rpartition("@")
    # No per-file checksums here (a dataset is thousands of chunk files): the manifest digest
    # pins every blob's digest, and ORAS checks each blob against it on the pull.
    values: dict[str, Any] = {
        "oci": {"repository": repository, "digest": digest},
        "fingerprint": dataset["fingerprint"],
        "made_from": made_from,
        "samples": int(dataset.get("samples") or 0),
        "made_on": cluster,
    }
    made_for = (result.get("annotations") or {}).get("io.kimideploy.made-for-drafter")
    if made_for:
        values["made_for"] = made_for
    with yaml_edit.editing(config):
        text = config.read_text()
        current = load_project_text(text, config).project
        created = name not in current.datasets
        if created and not current.datasets:
            text = yaml_edit.add_section(text, "datasets", {name: values})
        elif created:
            text = yaml_edit.add_entry(text, ("datasets",), name, values)
        else:
            text = yaml_edit.set_values(text, ("datasets", name), values)
        load_project_text(text, config)  # never write a file that no longer validates
        yaml_edit.replace_text(config, text)
    return PublishedData(
        name,
        str(result["reference"]),
        dataset["fingerprint"],
        values["samples"],
        len(result.get("files") or {}),
        created,
    )
