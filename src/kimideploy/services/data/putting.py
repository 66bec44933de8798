"""`kimideploy data put FILE --cluster C [--as PATH]`: a local file onto the datasets volume
(plan/dataset_upload.py says how it travels), the datasets claim created first when no run has
made it yet, everything it made for the transfer deleted afterwards."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kimideploy.cluster.apply import ObjectRef
from kimideploy.cluster.session import ClusterSession
from kimideploy.config.loading import LoadedProject
from kimideploy.errors import KimiDeployError, UsageError
from kimideploy.plan.dataset_upload import MAX_BYTES, upload
from kimideploy.plan.model import PlanRequest
from kimideploy.plan.resolve import plan_inputs
from kimideploy.render.manifests import render_objects
from kimideploy.services.preflight import run_probe_job
from kimideploy.services.rendering import render_workload
from kimideploy.services.reporting import Reporter

PUT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class PutResult:
    destination: str
    sha256: str
    size: int
    state: str
    """written, or present (the same bytes were there already)."""


def read_source(source: Path) -> bytes:
    try:
        size = source.stat().st_size
        if size > MAX_BYTES:
            raise UsageError(
                f"{source} is {size:,} bytes; `data put` carries at most {MAX_BYTES:,}",
                hint="copy a larger file onto the datasets volume by your storage's own means",
            )
        return source.read_bytes()
    except OSError as exc:
        raise UsageError(f"{source}: cannot read it ({exc.strerror})") from exc


def put_file(
    session: ClusterSession,
    loaded: LoadedProject,
    source: Path,
    *,
    relative: str | None,
    replace: bool,
    overrides: tuple[str, ...],
    reporter: Reporter,
    poll_s: float = 2.0,
) -> PutResult:
    data = read_source(source)
    request = PlanRequest("datagen", session.cluster, overrides=overrides)
    ctx = plan_inputs(loaded, request, session.answers)
    target = relative or ctx.cluster.workloads.datagen.prompts
    planned = upload(ctx, target, data, replace=replace)
    claim = ctx.claim_name("datasets")
    rendered = render_workload(loaded, request, session.answers)
    claims = [
        o
        for o in rendered.objects
        if o["kind"] == "PersistentVolumeClaim" and o["metadata"]["name"] == claim
    ]
    (job,) = render_objects((planned.job,), rendered.plan.kubernetes_version)
    parts = [dict(p) for p in planned.parts]
    if session.ensure_namespace():
        reporter.info(f"created namespace {session.namespace}")
    claims, notes = session.keep_claim_sizes(claims)
    for note in notes:
        reporter.info(f"note: {note}")
    session.validate([*claims, *parts, job])  # nothing is created unless all are accepted
    session.apply(claims)
    reporter.info(
        f"{source} ({planned.size:,} bytes, sha256 {planned.sha256[:12]}) -> "
        f"{planned.destination} on claim {claim}, in {len(parts)} part(s)"
    )
    session.apply(parts)
    try:
        snapshot = run_probe_job(session, job, PUT_TIMEOUT_S, poll_s)
    finally:
        for part in parts:
            session.delete(ObjectRef("ConfigMap", session.namespace, part["metadata"]["name"]))
    log = snapshot.logs.get(0, "").strip().splitlines()
    last = log[-1] if log else ""
    if not snapshot.done:
        why = "; ".join(snapshot.waiting.values()) or snapshot.message or snapshot.phase
        raise KimiDeployError(
            f"the upload Job {snapshot.name} did not finish ({why}); nothing was replaced",
            hint="`kubectl describe` its pod: the tools image must be pullable and the datasets "
            "claim mountable",
        )
    if last.startswith("conflict "):
        raise UsageError(
            f"{planned.destination} exists with other content (sha256 {last.split()[-1][:12]}); "
            "it was left as it is",
            hint="--replace puts this file there instead, or --as another path",
        )
    if last.startswith("raced "):
        raise KimiDeployError(
            f"{planned.destination} was replaced by another upload while this one wrote it: it "
            f"now holds sha256 {last.split()[-1][:12]}, not this file's {planned.sha256[:12]}",
            hint="two `data put --replace` to one path ran at once; run this one again if its "
            "content is the one wanted",
        )
    if last.startswith(("link ", "notfile ")):
        raise UsageError(
            f"{last.split(maxsplit=1)[-1]} on the datasets volume is a symbolic link or not a "
            "file; nothing was written",
            hint="remove it from the volume, or put the file --as another path",
        )
    if snapshot.phase == "failed":
        why = last or "; ".join(snapshot.index_failures.values()) or snapshot.message
        raise KimiDeployError(
            f"the upload Job {snapshot.name} failed ({why}); nothing was replaced",
            hint="run `kimideploy data put` again (the parts are sent again)",
        )
    state = "present" if last.startswith("present ") else "written"
    return PutResult(planned.destination, planned.sha256, planned.size, state)
