"""artifact-pull: the first init container of a pod that reads a published artifact (a served
or fine-tuned-from drafter, a pipeline's published conversations). Fetches each onto its volume
(once per digest), verified blob by blob by ORAS and file by file against the sha256 pinned in
kimideploy.yaml, and a dataset's fingerprint against the one pinned there: before drafter-check
reads a drafter, long before the 25-minute load or any GPU time. A wrong digest, a missing
artifact, refused credentials, a damaged blob or an unreachable registry fail the pod in
seconds, naming which."""

from __future__ import annotations

from pathlib import Path

from kimideploy.config.specs import PulledArtifact, WorkloadSpec
from kimideploy.workloads import dataset_record, oci_artifacts
from kimideploy.workloads.runtime import EXIT_OK, BadInputError, emit, log


def run(spec: WorkloadSpec) -> int:
    if not spec.pulls:
        log("no published artifact to pull")
    pulled: list[dict[str, str]] = []
    for artifact in spec.pulls:
        what = f"{artifact.kind} {artifact.name}"
        try:
            fetched = oci_artifacts.pull(
                artifact.reference,
                Path(artifact.dest),
                artifact.files,
                artifact.registry,
                check=_checker(artifact),
            )
        except oci_artifacts.RegistryError as exc:
            log(f"error: {what}: {exc}")
            log(f"hint: {exc.hint}")
            return exc.exit_code
        done = (
            "pulled and verified"
            if fetched
            else "already on the volume (same digest), every file re-verified against the pins"
        )
        log(f"{what}: {artifact.reference} {done} at {artifact.dest}")
        state = "pulled" if fetched else "present"
        pulled.append(
            {
                "name": artifact.name,
                "reference": artifact.reference,
                "dest": artifact.dest,
                "state": state,
            }
        )
    if spec.workload == "pull":  # its own Job: the CLI reads the result line (an init has none)
        emit({"event": "result", "stage": "pull", "pulled": pulled})
    return EXIT_OK


def _checker(artifact: PulledArtifact) -> oci_artifacts.FolderCheck | None:
    """A dataset's fingerprint.json must carry the id kimideploy.yaml pins: what every stage
    that reads it compares with (checked before the folder is put in place)."""
    if artifact.fingerprint is None:
        return None
    expected = artifact.fingerprint

    def check(folder: Path) -> None:
        record = dataset_record.read(folder)
        found = (record or {}).get("id")
        if found != expected:
            raise BadInputError(
                f"{artifact.reference}: its fingerprint.json says {found}, kimideploy.yaml pins "
                f"dataset {artifact.name} as {expected}; nothing was kept",
                hint="publish the dataset again (`kimideploy data publish`) to pin what it is",
            )

    return check
