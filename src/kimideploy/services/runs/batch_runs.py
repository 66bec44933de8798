"""Job runs: a new immutable Job per run, followed with progress from the workloads' JSON lines."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, replace
from typing import Any

from kimideploy.cluster.jobs import JobSnapshot
from kimideploy.cluster.session import ClusterSession
from kimideploy.config.loading import LoadedProject
from kimideploy.config.project import release_name
from kimideploy.errors import KimiDeployError, RolloutError, UsageError
from kimideploy.plan.jobs import AFTER_ANNOTATION
from kimideploy.plan.model import EngineStart, PlanRequest
from kimideploy.services.preflight import require_prerequisites, require_weights
from kimideploy.services.rendering import (
    PLAN_FACTS_SHOWN,
    Rendered,
    refuse_past_the_rental,
    render_workload,
)
from kimideploy.services.reporting import Reporter
from kimideploy.services.runs import progress, rental
from kimideploy.services.startup import PROGRESS_PERIOD_S, engine_phase, run_startup

RUN_ID_LABEL = "kimideploy.io/run-id"


@dataclass(frozen=True)
class RunStarted:
    run_id: str
    job: str
    rendered: Rendered
    later: tuple[dict[str, Any], ...] = ()
    """Jobs of the run created only once the one they name (AFTER_ANNOTATION) has succeeded."""


RUN_PARTS = ("ConfigMap", "NetworkPolicy", "Service")
"""Objects of a run that live as long as its Job (claims outlive it)."""


def new_run_id() -> str:
    return secrets.token_hex(3)


def start_run(
    session: ClusterSession,
    loaded: LoadedProject,
    request: PlanRequest,
    reporter: Reporter,
    *,
    force: bool = False,
) -> RunStarted:
    """Render with a fresh run id and create the run's objects. The rental limit is judged
    again on the cluster's own measured rates (before contact it had only the priors)."""
    if request.workload == "serve":
        raise UsageError("serve is a release, not a run", hint="use `kimideploy up serve`")
    run_id = request.run_id or new_run_id()
    rendered = render_workload(loaded, replace(request, run_id=run_id), session.answers)
    if not force:
        refuse_past_the_rental(loaded, rendered.plan)
    for warning in rendered.plan.warnings:
        reporter.info(f"warning: {warning}")
    for key, value in rendered.plan.facts:
        if key in PLAN_FACTS_SHOWN:
            reporter.info(f"{key}: {value}")
    rental.report(
        rental.cluster_notice(session, loaded.project, rendered.plan.cluster), reporter.info
    )
    require_prerequisites(session, rendered.objects, rendered.plan.cluster)
    # The same policy as `up`: a missing namespace is created when the user may (after the render
    # validated, so a bad config creates nothing), otherwise the refusal says who can.
    if session.ensure_namespace():
        reporter.info(f"created namespace {session.namespace}")
    for note in require_weights(session, rendered.preflight, rendered.plan.cluster):
        reporter.info(note)
    objects, notes = session.keep_claim_sizes(rendered.objects)
    for note in notes:
        reporter.info(f"note: {note}")
    session.validate(objects)  # nothing is created unless every object would be accepted
    later = tuple(o for o in objects if AFTER_ANNOTATION in _annotations(o))
    session.apply([o for o in objects if o not in later])
    job = next(o for o in objects if o["kind"] == "Job" and o not in later)["metadata"]["name"]
    # The run's ConfigMap, NetworkPolicy and Service go when the Job does (its TTL or a delete).
    session.adopt("Job", job, run_parts(objects))
    reporter.info(f"run {run_id}: created Job {job} in namespace {session.namespace}")
    return RunStarted(run_id, job, rendered, later)


def run_parts(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(o["kind"], o["metadata"]["name"]) for o in objects if o["kind"] in RUN_PARTS]


def next_job(
    session: ClusterSession, started: RunStarted, finished: str, reporter: Reporter
) -> str | None:
    """Create the run's Job that waits for `finished` (which has succeeded), and hand it the
    run's parts (its spec ConfigMap outlives the first Job); None when nothing waits for it."""
    waiting = next(
        (o for o in started.later if _annotations(o).get(AFTER_ANNOTATION) == finished), None
    )
    if waiting is None:
        return None
    session.apply([waiting])
    name: str = waiting["metadata"]["name"]
    session.adopt("Job", name, run_parts(started.rendered.objects))
    reporter.info(f"run {started.run_id}: {finished} succeeded; created Job {name}")
    return name


def _annotations(obj: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = obj.get("metadata", {}).get("annotations") or {}
    return found


def find_job(session: ClusterSession, run_id: str) -> str:
    runs = session.runs(f"{RUN_ID_LABEL}={run_id}")
    if not runs:
        raise UsageError(
            f"no run {run_id} in namespace {session.namespace}",
            hint="`kimideploy status` lists recent runs; pass --namespace if it ran elsewhere",
        )
    name: str = runs[0]["metadata"]["name"]
    return name


def follow_run(
    session: ClusterSession,
    job: str,
    run_id: str,
    reporter: Reporter,
    *,
    poll_s: float = 2,
    resume: str | None = None,
    engine: EngineStart | None = None,
) -> JobSnapshot:
    """Report progress until the Job ends; a failed run raises RolloutError (exit 4). A run that
    starts a vLLM engine (`engine`: where it logs) says which phase it is in until the workload's
    own progress lines begin, and ends with the engine's start-up by phase."""
    announced: set[int] = set()
    told: dict[int, str] = {}
    loading = EngineProgress(session, job, engine) if engine is not None else None
    while True:
        snapshot = session.job(job)
        summary = progress.aggregate(snapshot.logs, snapshot.completions)
        line = summary.describe() if summary else f"{snapshot.phase}: waiting for progress lines"
        if summary is None and loading is not None:
            line = loading.describe(line)
        if snapshot.phase == "suspended":
            line = f"suspended: {snapshot.message}"
        reporter.status(f"{job}: {snapshot.succeeded}/{snapshot.completions} indexes done; {line}")
        for index, holding in sorted(snapshot.waiting.items()):
            if told.get(index) != holding:
                told[index] = holding
                reporter.info(f"index {index}: {holding}")
        for index in snapshot.failed_indexes:
            if index not in announced:
                announced.add(index)
                reporter.info(
                    f"index {index} failed: {snapshot.index_failures.get(index, 'no pod details')}"
                    + _tail(snapshot.logs.get(index, ""))
                )
        if snapshot.done:
            if engine is not None:
                snapshot = _with_startup(session, snapshot, engine, reporter)
            return _finish(snapshot, run_id, reporter, resume)
        time.sleep(poll_s)


def _with_startup(
    session: ClusterSession, snapshot: JobSnapshot, engine: EngineStart, reporter: Reporter
) -> JobSnapshot:
    table = run_startup(session, snapshot.name, engine)
    if table is None:
        return snapshot
    reporter.info("engine start-up by phase (vLLM's own log lines):\n" + "\n".join(table.lines()))
    return replace(snapshot, engine_startup=table.to_dict())


class EngineProgress:
    """The phase a run's engine is in, from index 0's log (read at most every
    PROGRESS_PERIOD_S), while the workload has printed no progress yet."""

    def __init__(self, session: ClusterSession, job: str, engine: EngineStart) -> None:
        self.session, self.job, self.engine = session, job, engine
        self.read_at = 0.0
        self.phase: str | None = None

    def describe(self, line: str) -> str:
        if time.monotonic() - self.read_at >= PROGRESS_PERIOD_S:
            self.read_at = time.monotonic()
            self.phase = engine_phase(self.session, self.job, self.engine) or self.phase
        return f"{line}; vLLM: {self.phase}" if self.phase else line


def publish_result(
    session: ClusterSession,
    loaded: LoadedProject,
    request: PlanRequest,
    reporter: Reporter,
    *,
    poll_s: float,
) -> dict[str, Any]:
    """Run a publish Job to the end; its pod's result (digest, files' sha256, lineage or
    dataset fingerprint). Nothing is pinned here: the caller writes the config only after this."""
    started = start_run(session, loaded, request, reporter)
    snapshot = follow_run(session, started.job, started.run_id, reporter, poll_s=poll_s)
    result = run_results(snapshot).get("0")
    if not result or not result.get("digest"):
        raise KimiDeployError(
            f"the publish Job {started.job} ended without reporting a digest; kimideploy.yaml "
            "was not changed",
            hint=f"`kimideploy logs {started.run_id}` shows what the pod did",
        )
    return dict(result)


def run_facts(snapshot: JobSnapshot, run_id: str) -> dict[str, Any]:
    """A run's state as `-o json` outcomes carry it (the `run` key of kimideploy.outcome.v1)."""
    return {
        "id": run_id,
        "job": snapshot.name,
        "phase": snapshot.phase,
        "completions": snapshot.completions,
        "succeeded": snapshot.succeeded,
        "failed_indexes": list(snapshot.failed_indexes),
        "index_failures": {str(i): why for i, why in sorted(snapshot.index_failures.items())},
        "startup": snapshot.engine_startup,
    }


def run_results(snapshot: JobSnapshot) -> dict[str, Any]:
    """Each index's result line (without its event tag), keyed by index."""
    return {
        str(index): {k: v for k, v in result.items() if k != "event"}
        for index, result in sorted(progress.results(snapshot.logs).items())
    }


def _finish(
    snapshot: JobSnapshot, run_id: str, reporter: Reporter, resume: str | None = None
) -> JobSnapshot:
    for index, result in sorted(progress.results(snapshot.logs).items()):
        fields = ", ".join(f"{k}={_short(v)}" for k, v in result.items() if k != "event")
        reporter.info(f"index {index} result: {fields}")
    if snapshot.phase == "failed":
        failed = ", ".join(map(str, snapshot.failed_indexes)) or "?"
        reason = snapshot.message or "Job failed"
        raise RolloutError(
            f"run {run_id} ({snapshot.name}) failed: {reason}; failed indexes: {failed}",
            hint=f"`kimideploy logs {run_id}` shows each index's log; the Job is kept"
            + (f"; `{resume}` resumes from its last checkpoint" if resume else ""),
            outcome={
                "status": "failed",
                "run": run_facts(snapshot, run_id),
                "results": run_results(snapshot),
            },
        )
    done = f"{snapshot.succeeded}/{snapshot.completions}"
    reporter.info(f"run {run_id} ({snapshot.name}) complete: {done} indexes")
    return snapshot


def _short(value: object) -> str:
    """Lists and objects (a bench's levels) are summarised; `logs RUN_ID` has them whole."""
    if isinstance(value, list):
        return f"[{len(value)} items]"
    if isinstance(value, dict):
        return f"{{{len(value)} fields}}"
    return str(value)


def _tail(text: str, lines: int = 5) -> str:
    kept = [line for line in text.strip().splitlines() if line][-lines:]
    return ("\n    " + "\n    ".join(kept)) if kept else ""


def pods_of(session: ClusterSession, target: str, project_name: str) -> list[str]:
    """Pod names for `logs serve` or `logs <run-id>`."""
    if target == "serve":
        selector = f"app.kubernetes.io/instance={release_name(project_name, 'serve')}"
    else:
        selector = f"{RUN_ID_LABEL}={target}"
    pods = [p["metadata"]["name"] for p in session.pods(selector)]
    if not pods:
        if target != "serve":
            find_job(session, target)  # raises the clearer "no run" error when that is the cause
        raise UsageError(f"no pods for {target} in namespace {session.namespace}")
    return pods
