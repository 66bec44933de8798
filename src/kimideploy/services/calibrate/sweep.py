"""`kimideploy run calibrate`: measure the step cost C(k, c) before any drafter is trained.

Order of work (each model load is ~25 minutes on the real target):
1. render everything first: the non-speculative baseline and one calibration revision per k
   (the resolver refuses an image without synthetic rejection sampling here, before any write);
   say how many loads and bench passes that is, and how long it may take; confirm once;
2. resume: a stored partial calibration of the same plan (cluster, image, serve configuration,
   bench settings, drafter and grid) keeps its measured k and its baseline;
3. baseline: the newest comparable non-speculative bench run if there is one (as the gate picks
   it), else the serving revision when it is that configuration, else one more load;
4. per k: deploy the calibration revision (k drafts, synthetic acceptance, the control
   extension), bench every acceptance length at every concurrency in one Job, store the points
   and the fit after each k;
5. restore the revision that served before (or take the release down if nothing did), also
   after a failure; an interrupt leaves the calibration revision and says how to restore.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from kimideploy.cluster.bench_results import StoredBench
from kimideploy.cluster.records import ReleaseRecord
from kimideploy.cluster.session import ClusterSession
from kimideploy.config.drafters import NO_DRAFTER
from kimideploy.config.loading import LoadedProject
from kimideploy.errors import KimiDeployError, RolloutError, UsageError
from kimideploy.formats.bench_result import BenchResult
from kimideploy.plan.asks import ServeAsk, SyntheticAcceptance
from kimideploy.plan.calibration import (
    DEFAULT_KS,
    DEFAULT_LENGTHS,
    Calibration,
    Point,
    lengths_for,
)
from kimideploy.plan.model import PlanRequest
from kimideploy.services.gate.gating import (
    GateOptions,
    GateRun,
    GateTerms,
    bench_revision,
    gate_terms,
    serves_like,
    serving_record,
)
from kimideploy.services.gate.restore import restore_serving
from kimideploy.services.gate.verdict import GateMeasurementError, pick_baseline
from kimideploy.services.preflight import require_prerequisites
from kimideploy.services.release import deploy
from kimideploy.services.rendering import Rendered, render_workload
from kimideploy.services.reporting import Reporter

ACCEPTANCE_TOLERANCE = 0.15
"""How far vLLM's measured mean acceptance length may sit from the requested synthetic one
before the run says so (the fit uses the measured length either way)."""


@dataclass(frozen=True)
class CalibrateOptions:
    ks: tuple[int, ...] = DEFAULT_KS
    lengths: tuple[float, ...] = DEFAULT_LENGTHS
    concurrency: tuple[int, ...] | None = None
    image: str | None = None
    again: bool = False
    bench_poll_s: float = 5.0


@dataclass(frozen=True)
class CalibrationPlan:
    cluster: str
    drafter: str
    release: str
    baseline: Rendered
    revisions: dict[int, Rendered]
    lengths: dict[int, tuple[float, ...]]
    gate: GateTerms
    image: str
    serve_fingerprint: str
    gpus: str
    calibration_id: str
    startup_budget_s: int
    num_prompts: int
    max_tokens: int

    def describe(self, baseline_load: bool, done: set[int], baseline: StoredBench | None) -> str:
        """The loads and bench levels still to do, and how long they may take: every load up to
        the startup budget, and the bench at the baseline's tokens/s when one is known."""
        todo = [k for k in self.revisions if k not in done]
        loads = len(todo) + (1 if baseline_load else 0)
        per_pass = len(self.gate.needed)
        passes = sum(len(self.lengths[k]) for k in todo)
        load_s = loads * self.startup_budget_s
        bench = f"{passes * per_pass} bench levels ({per_pass} per acceptance length)"
        if baseline is not None:
            rates = {lv.key: lv.output_tokens_per_s for lv in baseline.result.levels}
            tokens = self.num_prompts * self.max_tokens
            level_s = sum(tokens / rates[key] for key in self.gate.needed if rates.get(key))
            bench += f", about {_minutes(level_s * passes)} at the baseline's tokens/s"
        resumed = f"; resuming, k={sorted(done)} already measured" if done else ""
        grid = "; ".join(f"k={k} at {', '.join(map(str, self.lengths[k]))}" for k in todo)
        resumed += f"; acceptance lengths {grid}" if grid else ""
        which = ", ".join([*(["baseline"] if baseline_load else []), *(f"k={k}" for k in todo)])
        return (
            f"calibrate {self.cluster} on {self.image}: {loads} model load(s) ({which or 'none'}, "
            f"each up to the startup budget: {_minutes(load_s)} at most), {bench}{resumed}"
        )


def _minutes(seconds: float) -> str:
    minutes = max(1, round(seconds / 60))
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def _now(session: ClusterSession) -> str:
    """The API server's clock: a calibration is dated and ordered in it."""
    return session.server_time().replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%S%z")


def calibration_requests(
    loaded: LoadedProject,
    cluster: str | None,
    drafter: str | None,
    overrides: tuple[str, ...],
    *,
    options: CalibrateOptions,
) -> tuple[str, dict[int, PlanRequest], PlanRequest]:
    """The drafter, one serve request per k (synthetic acceptance) and the baseline's request:
    resolved offline before any cluster is contacted, rendered again once connected."""
    project = loaded.project
    cluster_name = project.cluster_name(cluster)
    if cluster_name in project.clusters and drafter is None:
        drafter = project.clusters[cluster_name].workloads.train.drafter
    if drafter is None or drafter == NO_DRAFTER:
        raise UsageError(
            "calibration serves a drafter's draft passes; --drafter none has none",
            hint="any drafter of the target's shape will do (an untrained one too)",
        )
    if not options.ks or not options.lengths:
        raise UsageError("--k and --acceptance-length need at least one value each")
    requests = {
        k: PlanRequest(
            "serve",
            cluster,
            drafter,
            overrides,
            ask=ServeAsk(
                image=options.image,
                synthetic=SyntheticAcceptance(k, lengths_for(k, options.lengths)),
            ),
        )
        for k in sorted(set(options.ks))
    }
    base = PlanRequest("serve", cluster, NO_DRAFTER, overrides, ask=ServeAsk(image=options.image))
    return drafter, requests, base


def plan_calibration(
    session: ClusterSession,
    loaded: LoadedProject,
    cluster: str | None,
    drafter: str | None,
    *,
    overrides: tuple[str, ...],
    options: CalibrateOptions,
) -> CalibrationPlan:
    """Render every revision and bench before anything is created (the resolver's refusals)."""
    project = loaded.project
    drafter, requests, base_request = calibration_requests(
        loaded, cluster, drafter, overrides, options=options
    )
    lengths = {k: lengths_for(k, options.lengths) for k in requests}
    revisions = {
        k: render_workload(loaded, request, session.answers) for k, request in requests.items()
    }
    baseline = render_workload(loaded, base_request, session.answers)
    gate = gate_terms(session, loaded, base_request, GateOptions(concurrency=options.concurrency))
    plan = baseline.plan
    profile = project.clusters[plan.cluster]
    gpu = profile.gpu
    seqs = profile.workloads.serve.max_num_seqs
    beyond = sorted({c for _, c in gate.needed if c > seqs})
    if beyond:
        raise UsageError(
            f"--concurrency {','.join(map(str, beyond))}: above serve.max_num_seqs ({seqs}) vLLM "
            "queues the extra requests, so the step cost there would be the queue's",
            hint=f"calibrate at concurrencies up to {seqs}",
        )
    key = {
        "cluster": plan.cluster,
        "image": plan.image,
        "serve": plan.inputs["serve_fingerprint"],
        "bench": gate.bench_print,
        "drafter": drafter,
        "lengths": {str(k): list(v) for k, v in lengths.items()},
        "levels": sorted(c for _, c in gate.needed),
    }
    calibration_id = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
    return CalibrationPlan(
        cluster=plan.cluster,
        drafter=drafter,
        release=plan.release,
        baseline=baseline,
        revisions=revisions,
        lengths=lengths,
        gate=gate,
        image=plan.image,
        serve_fingerprint=plan.inputs["serve_fingerprint"],
        gpus=f"{gpu.per_node} x {gpu.product} per replica",
        calibration_id=calibration_id,
        startup_budget_s=profile.workloads.serve.startup_budget_s,
        num_prompts=profile.workloads.bench.num_prompts,
        max_tokens=profile.workloads.bench.max_tokens,
    )


def calibrate(
    session: ClusterSession,
    loaded: LoadedProject,
    plan: CalibrationPlan,
    options: CalibrateOptions,
    apply: deploy.ApplyOptions,
    reporter: Reporter,
) -> Calibration:
    """Carry out a plan from plan_calibration (which has refused everything it could)."""
    earlier = [
        (cid, c)
        for cid, c in session.calibrations(plan.cluster)
        if cid.split("-")[0] == plan.calibration_id
    ]
    stored = earlier[-1][1] if earlier else None
    if stored is not None and stored.complete and not options.again:
        reporter.info(
            f"calibration {earlier[-1][0]} of this plan was measured on {stored.date}; "
            "nothing to do (--again measures it anew)"
        )
        return stored
    if stored is not None and (stored.complete or options.again):
        # A new measurement is stored next to the old one, which predictions keep using until
        # the new one is complete.
        plan = replace(plan, calibration_id=f"{plan.calibration_id}-{len(earlier)}")
        stored = None
    elif earlier:
        plan = replace(plan, calibration_id=earlier[-1][0])
    calibration = stored or _fresh(plan, _now(session))
    found = serving_record(session, plan.release)
    baseline = _stored_baseline(session, plan, calibration)
    needs_load = baseline is None and not (
        found is not None and serves_like(found, plan.gate.serve_print)
    )
    reporter.info(plan.describe(needs_load, {int(k) for k in calibration.runs}, baseline))
    for rendered in (plan.baseline, *plan.revisions.values()):  # before the first write
        require_prerequisites(session, rendered.objects, plan.cluster)
    if session.ensure_namespace():
        reporter.info(f"created namespace {session.namespace}")
    before = f"revision {found.revision} ({found.drafter})" if found else "nothing"
    if not (apply.change.yes or reporter.confirm(f"calibrate, then restore {before}?")):
        raise KimiDeployError("cancelled; nothing was changed", hint="pass --yes to skip this")
    sweep = Sweep(session, loaded, plan, options, apply.unattended(), reporter)
    latest: int | None = None
    try:
        if baseline is None:
            baseline, latest = _measure_baseline(sweep, found)
            calibration = replace(calibration, baseline_run=baseline.run_id)
        for k, rendered in plan.revisions.items():
            if str(k) in calibration.runs:
                continue
            latest = _deploy(sweep, rendered, f"k={k}")
            calibration = _measure_k(sweep, k, latest, baseline, calibration=calibration)
            session.store_calibration(plan.calibration_id, calibration)
        calibration = replace(calibration, complete=True, measured_at=_now(session))
        session.store_calibration(plan.calibration_id, calibration)
    except KeyboardInterrupt:
        reporter.info(_interrupted(plan, found, calibration))
        raise
    except KimiDeployError as exc:
        session.store_calibration(plan.calibration_id, calibration)
        restored = _restore(sweep, found, latest)
        raise RolloutError(
            f"calibration stopped: {exc.message}; {restored}",
            hint="run the same `kimideploy run calibrate` again to resume at the next k "
            f"(measured so far: k={sorted(int(k) for k in calibration.runs) or 'none'})",
        ) from exc
    reporter.info(_restore(sweep, found, latest))
    return calibration


@dataclass(frozen=True)
class Sweep:
    """What every step of one calibration shares (the plan with its final id, and the change
    options after the one confirmation)."""

    session: ClusterSession
    loaded: LoadedProject
    plan: CalibrationPlan
    options: CalibrateOptions
    apply: deploy.ApplyOptions
    reporter: Reporter

    def gate_run(self) -> GateRun:
        return GateRun(
            self.session,
            self.loaded,
            self.plan.gate,
            self.reporter,
            bench_poll_s=self.options.bench_poll_s,
        )


def _fresh(plan: CalibrationPlan, measured_at: str) -> Calibration:
    return Calibration(
        cluster=plan.cluster,
        image=plan.image,
        serve_fingerprint=plan.serve_fingerprint,
        bench_fingerprint=plan.gate.bench_print,
        gpus=plan.gpus,
        drafter=plan.drafter,
        measured_at=measured_at,
        ks=sorted(plan.revisions),
        lengths=sorted({length for ls in plan.lengths.values() for length in ls}),
        concurrency=sorted({c for _, c in plan.gate.needed}),
        baseline_run="",
        points=[],
        bench_settings={
            "prompt_sets": sorted({p for p, _ in plan.gate.needed}),
            "num_prompts": plan.num_prompts,
            "max_tokens": plan.max_tokens,
        },
    )


def _stored_baseline(
    session: ClusterSession, plan: CalibrationPlan, calibration: Calibration
) -> StoredBench | None:
    """A resumed calibration keeps its baseline (its points were measured against it)."""
    stored = session.bench_results(plan.release)
    if calibration.baseline_run:
        same = next((b for b in stored if b.run_id == calibration.baseline_run), None)
        if same is not None:
            return same
    chosen, _ = pick_baseline(
        stored,
        cluster=plan.cluster,
        serve_print=plan.gate.serve_print,
        bench_print=plan.gate.bench_print,
        needed=plan.gate.needed,
        max_age_h=plan.gate.settings.baseline_max_age_h,
        now=datetime.now(UTC).replace(microsecond=0),
    )
    return chosen if not calibration.points else None


def _deploy(sweep: Sweep, rendered: Rendered, what: str) -> int:
    note = f"calibration revision ({what})"
    revision = deploy.revision_from_render(sweep.loaded, rendered, note=note)
    sweep.reporter.info(f"calibrate: deploying the {what} revision")
    return deploy.deploy(
        sweep.session, revision, sweep.apply, sweep.reporter, action="calibrate"
    ).revision


def _measure_baseline(sweep: Sweep, found: ReleaseRecord | None) -> tuple[StoredBench, int | None]:
    plan, reporter = sweep.plan, sweep.reporter
    latest = None
    if found is not None and serves_like(found, plan.gate.serve_print):
        revision = found.revision
        reporter.info(f"calibrate: revision {revision} already serves without a drafter")
    else:
        latest = revision = _deploy(sweep, plan.baseline, "non-speculative baseline")
    request = PlanRequest("serve", plan.cluster, NO_DRAFTER, plan.baseline.plan.inputs["overrides"])
    try:
        stored = bench_revision(sweep.gate_run(), request, revision)
    except GateMeasurementError as exc:
        raise RolloutError(f"the non-speculative baseline could not be measured: {exc}") from exc
    return stored, latest


def _measure_k(
    sweep: Sweep, k: int, revision: int, baseline: StoredBench, *, calibration: Calibration
) -> Calibration:
    plan, reporter = sweep.plan, sweep.reporter
    request = PlanRequest(
        "serve",
        plan.cluster,
        plan.drafter,
        tuple(plan.revisions[k].plan.inputs["overrides"]),
        ask=ServeAsk(synthetic=SyntheticAcceptance(k, plan.lengths[k])),
    )
    try:
        stored = bench_revision(sweep.gate_run(), request, revision)
    except GateMeasurementError as exc:
        raise RolloutError(f"k={k}: {exc}") from exc
    points = points_from(k, stored.result, baseline.result)
    if not points:
        raise RolloutError(
            f"k={k}: bench run {stored.run_id} measured no synthetic level that the baseline "
            "has too (were the bench settings changed meanwhile?)"
        )
    for point in points:
        if point.measured_length is None:
            reporter.info(f"note: k={k} c={point.concurrency}: vLLM's counters were not scraped")
        elif abs(point.measured_length - point.requested_length) > ACCEPTANCE_TOLERANCE:
            reporter.info(
                f"note: k={k} c={point.concurrency} asked acceptance length "
                f"{point.requested_length}, vLLM counted {point.measured_length:.2f}; the fit "
                "uses what vLLM counted"
            )
    return replace(
        calibration,
        points=[*calibration.points, *points],
        runs={**calibration.runs, str(k): stored.run_id},
    )


def points_from(k: int, result: BenchResult, baseline: BenchResult) -> list[Point]:
    """The bench's synthetic levels, each over the baseline's level of the same prompt set and
    concurrency; levels that failed or have no baseline are left out."""
    base = baseline.by_key()
    points = []
    for level in result.levels:
        plain = base.get(level.key)
        requested = level.synthetic_acceptance_length
        if plain is None or requested is None or not level.output_tokens_per_s:
            continue
        if not plain.output_tokens_per_s:
            continue
        points.append(
            Point(
                k=k,
                concurrency=level.concurrency,
                prompt_set=level.prompt_set,
                requested_length=requested,
                measured_length=level.mean_acceptance_length,
                tokens_per_s=level.output_tokens_per_s,
                baseline_tokens_per_s=plain.output_tokens_per_s,
            )
        )
    return points


def _restore(sweep: Sweep, found: ReleaseRecord | None, latest: int | None) -> str:
    """Put back what served before the calibration; say what was done."""
    return restore_serving(
        sweep.session,
        sweep.plan.release,
        found,
        latest,
        apply=sweep.apply,
        reporter=sweep.reporter,
        after=f"calibration {sweep.plan.calibration_id}",
    )


def _interrupted(plan: CalibrationPlan, found: ReleaseRecord | None, cal: Calibration) -> str:
    measured = sorted(int(k) for k in cal.runs)
    back = (
        f"`kimideploy rollback serve --to {found.revision}` restores what served before"
        if found
        else "`kimideploy down serve` removes the calibration revision"
    )
    return (
        f"interrupted: measured k={measured or 'none'} (stored); the calibration revision may "
        f"still serve: {back}; the same `run calibrate` resumes"
    )
