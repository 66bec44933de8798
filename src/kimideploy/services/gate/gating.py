"""`up serve --gate`: deploy a drafter, measure it against no drafter, keep it or roll back.

Order of work, chosen to spend as few 25-minute model loads as possible:
1. find the newest comparable non-speculative baseline (same cluster, same serve container and
   replicas, same bench settings, every gated level, younger than gate.baseline_max_age_h);
2. if there is none: bench the serving revision when it already is that non-speculative
   configuration, else deploy it first (one extra load, said out loud), and store the result;
3. deploy the drafter revision (the engine rolls back by itself if it never becomes ready);
4. bench it, judge, record the verdict on its release record, and roll back to non-speculative
   serving when it does not pay, or when the gate could not measure (unless fail-open).

Where no fresh stored baseline compares and the drafter's pods can switch speculation off (vLLM
0.32 with kimideploy's patch 0002; gate.baseline: auto or same-server), step 2 is skipped: the
drafter is deployed first and the baseline is measured on its own pods with speculation switched
off, in rounds interleaved with the drafter's (services/gate/interleave.py), each switch a
recorded revision that takes seconds. No second model load; the baseline then runs with the
drafter's weights and KV cache still allocated (the plan's "speculation off" line says how much),
which the verdict names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from functools import partial
from typing import Any

from kimideploy.cluster.bench_results import MeasuredOn, StoredBench
from kimideploy.cluster.jobs import JobSnapshot
from kimideploy.cluster.records import ReleaseRecord
from kimideploy.cluster.session import ClusterSession
from kimideploy.config.drafters import NO_DRAFTER
from kimideploy.config.gate import GateSettings
from kimideploy.config.loading import LoadedProject
from kimideploy.config.specs import BenchSpec, ServeSpec
from kimideploy.errors import KimiDeployError, OutcomeFacts, RolloutError, UsageError
from kimideploy.formats.bench_result import BenchResult, BenchResultError
from kimideploy.plan.asks import BenchAsk, ServeAsk
from kimideploy.plan.inputs import DATASETS_MOUNT, gate_levels
from kimideploy.plan.model import PlanRequest
from kimideploy.plan.serve import SPEC_SHA256_ANNOTATION
from kimideploy.services.gate import interleave, references
from kimideploy.services.gate.verdict import (
    KEEP,
    ROLLBACK,
    GateMeasurementError,
    Verdict,
    bench_fingerprint,
    compare_with_baseline,
    judge,
    pick_baseline,
    serve_fingerprint,
)
from kimideploy.services.release import deploy, lifecycle, swap
from kimideploy.services.rendering import Rendered, render_workload
from kimideploy.services.reporting import Reporter
from kimideploy.services.runs import batch_runs, progress


class GateRejectedError(RolloutError):
    """The gate rolled the drafter back (too slow, or the gate could not measure it)."""


@dataclass(frozen=True, kw_only=True)
class GateOptions:
    """Command-line overrides of the cluster's `gate:` settings; None keeps the config's."""

    min_speedup: float | None = None
    concurrency: tuple[int, ...] | None = None
    fail_open: bool | None = None
    baseline: str | None = None
    """auto, same-server or separate (gate.baseline)."""
    bench_poll_s: float = 5.0


@dataclass(frozen=True)
class GateTerms:
    """What one gate judges by: the release, the comparable baseline's fingerprints, the levels it
    needs and the settings (the config's, with the command line's overrides)."""

    release: str
    cluster: str
    image: str
    settings: GateSettings
    needed: list[tuple[str, int]]
    bench_concurrency: tuple[int, ...]
    serve_print: str
    bench_print: str


@dataclass(frozen=True)
class GateRun:
    """What every step of one gate invocation shares: where it acts, the config, the gate's
    context, how it changes the release and polls the bench, and how it reports. The steps take
    this and only what varies between them."""

    session: ClusterSession
    loaded: LoadedProject
    gate: GateTerms
    reporter: Reporter
    apply: deploy.ApplyOptions = field(default_factory=deploy.ApplyOptions)
    bench_poll_s: float = 5.0


SAME_SERVER_BASELINE_GAP = "0.72-0.78x"
"""The switched-off baseline's output tokens/s against a separately started non-speculative
server's, on the pipeline tier (vLLM 0.32 CPU, c=4, two runs; tests/pipeline/test_drafter_swap.py
prints it each run). Not yet measured on a GPU; the verdict states it so the user can judge."""


def _now(session: ClusterSession) -> datetime:
    """The API server's clock: stored results are dated and aged in it, not this machine's."""
    return session.server_time().replace(microsecond=0)


def gate_terms(
    session: ClusterSession, loaded: LoadedProject, request: PlanRequest, options: GateOptions
) -> GateTerms:
    baseline = render_workload(loaded, replace(request, drafter=NO_DRAFTER), session.answers)
    cluster = loaded.project.clusters[baseline.plan.cluster]
    given = request.asked(ServeAsk).gate_levels or options.concurrency
    settings = cluster.gate.model_copy(
        update={
            k: v
            for k, v in {
                "min_speedup": options.min_speedup,
                "concurrency": list(given) if given else None,
                "fail_open": options.fail_open,
                "baseline": options.baseline,
            }.items()
            if v is not None
        }
    )
    bench = cluster.workloads.bench
    levels = gate_levels(cluster, given)
    return GateTerms(
        release=baseline.plan.release,
        cluster=baseline.plan.cluster,
        image=baseline.plan.image,
        settings=settings,
        needed=[(p, c) for p in bench.prompt_sets for c in levels],
        bench_concurrency=tuple(sorted(levels)),
        serve_print=serve_fingerprint(baseline.objects),
        bench_print=bench_fingerprint(
            list(bench.prompt_sets), bench.num_prompts, bench.max_tokens, bench.prompt_files
        ),
    )


def up_gated(
    session: ClusterSession,
    loaded: LoadedProject,
    request: PlanRequest,
    apply: deploy.ApplyOptions,
    *,
    options: GateOptions,
    reporter: Reporter,
) -> tuple[deploy.Outcome, Verdict]:
    """Deploy request's drafter, measure, and keep it or roll back; the verdict is recorded."""
    drafter = request.drafter
    if drafter in (None, NO_DRAFTER):
        raise UsageError(
            "--gate compares a drafter with no drafter; name one with --drafter",
            hint="e.g. `kimideploy up serve --drafter v3 --gate`",
        )
    if not apply.wait.wait:
        raise UsageError("--gate needs to follow the rollout; drop --no-wait")
    session.ensure_namespace()
    gate = gate_terms(session, loaded, request, options)
    levels = ", ".join(sorted({f"c={c}" for _, c in gate.needed}, key=lambda s: int(s[2:])))
    reporter.info(
        f"gate: keep {drafter} only with >= {gate.settings.min_speedup:.2f}x output tokens/s "
        f"over no drafter at {levels} ({', '.join(sorted({p for p, _ in gate.needed}))})"
    )
    rendered = deploy.plan_up(session, loaded, request, apply.change.force)
    even = rendered.plan.break_even
    if even:
        at = ", ".join(f"c={c} {r:.1%}" for c, r in even["rate"].items())
        reporter.info(f"gate: break-even acceptance rate {at} (step cost: {even['source']})")
    run = GateRun(session, loaded, gate, reporter, apply, options.bench_poll_s)
    if _on_one_server(run, rendered):
        outcome = deploy.apply_up(session, loaded, rendered, apply, reporter=reporter)
        verdict, serving = _measure_on_one_server(run, request, outcome.revision)
        # The drafter serves again as the last round's revision: the one the verdict is about.
        outcome = replace(outcome, revision=serving)
    else:
        baseline, note = _baseline(run, request)
        outcome = deploy.apply_up(session, loaded, rendered, apply, reporter=reporter)
        verdict = _measure_and_judge(run, request, outcome.revision, baseline, note=note)
    _record_verdict(session, gate.release, outcome.revision, verdict)
    reporter.info(f"gate: revision {outcome.revision} ({drafter}) {verdict.summary()}")
    if verdict.decision == KEEP:
        if not verdict.gate_failed:  # a fail-open keep measured nothing to refer to
            _record_reference(session, loaded, rendered, drafter, outcome.revision, verdict)
        return outcome, verdict
    judged = OutcomeFacts(
        release=gate.release, revision=outcome.revision, verdict=verdict.details()
    )
    back = _roll_back(run, outcome.revision, verdict, judged)
    raise GateRejectedError(
        f"drafter {drafter} was rolled back by the gate: {verdict.reason}",
        hint="`kimideploy history serve` shows the verdict; --gate-fail-open keeps a drafter "
        "when the gate itself fails",
        outcome={**judged, "status": "gate-rolled-back", "serving_revision": back.revision},
    )


def _record_reference(
    session: ClusterSession,
    loaded: LoadedProject,
    rendered: Rendered,
    drafter: str,
    revision: int,
    verdict: Verdict,
) -> None:
    """The kept drafter's acceptance on this engine, kept for the next engine change."""
    record = loaded.project.drafters.get(drafter)
    held_out = getattr(record, "held_out", None)  # a model-free method has no training figures
    spec = rendered.plan.spec
    k = spec.num_speculative_tokens if isinstance(spec, ServeSpec) else None
    entry = references.reference(
        rendered.objects,
        drafter=drafter,
        revision=revision,
        k=k,
        verdict=verdict,
        held_out=held_out,
    )
    references.record(session, entry)


def _on_one_server(run: GateRun, rendered: Rendered) -> bool:
    """Whether the baseline is measured on the drafter's own pods with speculation switched off:
    gate.baseline same-server, or auto where the pods can switch and no fresh stored baseline
    compares (a stored one costs nothing to use)."""
    choice = run.gate.settings.baseline
    if choice == "separate":
        return False
    switches = swap.loaded_drafter(rendered.objects) is not None
    if choice == "same-server" and not switches:
        raise UsageError(
            "gate.baseline same-server: this drafter's pods cannot switch speculation off (the "
            f"plan says why: {dict(rendered.plan.facts).get('speculation off', 'no drafter')})",
            hint="--gate-baseline separate measures on a non-speculative revision of its own",
        )
    if choice == "auto":
        stored, _ = stored_baseline(run.session, run.gate)
        return switches and stored is None
    return True


def _measure_on_one_server(
    run: GateRun, request: PlanRequest, revision: int
) -> tuple[Verdict, int]:
    """The drafter's revision (serving) and its pods with speculation switched off, benched in
    interleaved rounds; judged on each one's mean. Leaves the drafter serving; returns the
    verdict and the revision that then serves."""
    session, settings, reporter = run.session, run.gate.settings, run.reporter
    drafter = request.drafter or NO_DRAFTER
    rounds = settings.same_server_rounds
    note = (
        f"baseline measured on the drafter's own pods with speculation switched off, "
        f"interleaved with the drafter over {rounds} round(s): no second load; the drafter's "
        "weights and KV cache stay allocated meanwhile. Measured on vLLM's CPU engine, this "
        f"baseline read {SAME_SERVER_BASELINE_GAP} of a separately started plain server's "
        "throughput (bench/MEASUREMENTS.md): a low baseline favours the drafter; "
        "--gate-baseline separate loads a plain server instead"
    )
    reporter.info(f"gate: {note}")
    latest = revision
    runs: dict[str, list[str]] = {}

    def request_of(name: str) -> PlanRequest:
        return request if name == drafter else replace(request, drafter=NO_DRAFTER)

    def serve(name: str) -> None:
        nonlocal latest
        latest = switch_round(run, request_of(name), f"gate round ({name})").revision

    def bench(name: str) -> BenchResult:
        record = next(r for r in session.history(run.gate.release) if r.revision == latest)
        stored = bench_revision(run, request_of(name), latest, record_serve_print(record))
        runs.setdefault(name, []).append(stored.run_id)
        return stored.result

    try:
        first = {drafter: [bench(drafter)]}
        serve(NO_DRAFTER)
        first[NO_DRAFTER] = [bench(NO_DRAFTER)]
        orders = interleave.round_orders([drafter, NO_DRAFTER], rounds)
        later = interleave.run_rounds(orders, NO_DRAFTER, serve, bench)
        if not orders or orders[-1][-1] == NO_DRAFTER:
            serve(drafter)  # the gate judges what serves: the drafter, switched back on
        merged = {n: interleave.merge_rounds([*first[n], *later.get(n, [])]) for n in first}
        keep, reason, levels = judge(
            merged[drafter], merged[NO_DRAFTER], run.gate.needed, settings.min_speedup
        )
    except (GateMeasurementError, RolloutError) as exc:
        failed = Verdict(
            KEEP if settings.fail_open else ROLLBACK,
            f"gate failed: {getattr(exc, 'message', exc)}",
            settings.min_speedup,
            [],
            ",".join(runs.get(drafter, [])) or None,
            ",".join(runs.get(NO_DRAFTER, [])) or None,
            note,
            gate_failed=True,
            fail_open=settings.fail_open,
        )
        return failed, latest
    verdict = Verdict(
        KEEP if keep else ROLLBACK,
        reason,
        settings.min_speedup,
        levels,
        ",".join(runs[drafter]),
        ",".join(runs[NO_DRAFTER]),
        note,
    )
    return verdict, latest


def switch_round(run: GateRun, request: PlanRequest, note: str) -> deploy.Outcome:
    """One round's revision on the same pods: the drafter switched on, or (drafter none) its pods
    with speculation switched off. A revision that had to replace the pods is a measurement
    error: the rounds would no longer compare one server with itself."""
    loaded, session = run.loaded, run.session
    rendered = render_workload(loaded, request, session.answers)
    revision = deploy.revision_from_render(loaded, rendered, note=note)
    form = deploy.switch_off_form(loaded, request, session.answers)
    revision = replace(revision, switch_off=form)
    outcome = deploy.deploy(
        session, revision, run.apply.unattended(auto_rollback=False), run.reporter, action="gate"
    )
    if outcome.change not in ("speculation off", "speculation on", "swap"):
        raise GateMeasurementError(
            f"revision {outcome.revision} was a {outcome.change}, not a switch of the same pods"
        )
    return outcome


def _baseline(run: GateRun, request: PlanRequest) -> tuple[StoredBench | None, str]:
    session, gate, reporter = run.session, run.gate, run.reporter
    stored, why = stored_baseline(session, gate)
    if stored is not None:
        reporter.info(f"gate: comparing with {why}")
        return stored, why
    reporter.info(f"gate: {why}; measuring a fresh non-speculative baseline")
    serving = serving_record(session, gate.release)
    if serving is not None and serves_like(serving, gate.serve_print):
        reporter.info(f"gate: revision {serving.revision} already serves without a drafter")
        revision = serving.revision
    else:
        reporter.info(
            "gate: deploying the non-speculative configuration first "
            "(one more model load, so that the comparison is like for like)"
        )
        baseline = replace(request, drafter=NO_DRAFTER)
        revision = deploy.up(session, run.loaded, baseline, run.apply, reporter).revision
    try:
        return bench_revision(run, replace(request, drafter=NO_DRAFTER), revision), (
            f"fresh baseline measured on revision {revision} ({why})"
        )
    except GateMeasurementError as exc:
        if gate.settings.fail_open:
            reporter.info(f"gate: baseline failed ({exc}); fail-open: deploying the drafter anyway")
            return None, f"baseline failed: {exc}"
        raise RolloutError(
            f"gate: the non-speculative baseline could not be measured: {exc}; "
            f"the drafter was not deployed (revision {revision}, no drafter, keeps serving)",
            hint="`kimideploy logs RUN_ID` shows the bench pod's log; --gate-fail-open deploys "
            "the drafter without a baseline",
        ) from exc


def stored_baseline(session: ClusterSession, gate: GateTerms) -> tuple[StoredBench | None, str]:
    """The newest stored non-speculative bench result the gate may compare with, and why."""
    return pick_baseline(
        session.bench_results(gate.release),
        cluster=gate.cluster,
        serve_print=gate.serve_print,
        bench_print=gate.bench_print,
        needed=gate.needed,
        max_age_h=gate.settings.baseline_max_age_h,
        now=_now(session),
    )


def serving_record(session: ClusterSession, release: str) -> ReleaseRecord | None:
    found: ReleaseRecord | None = lifecycle.serving(session.history(release))
    return found


def record_serve_print(record: ReleaseRecord) -> str | None:
    """The serve fingerprint of a stored revision (None when its manifests lack a Deployment)."""
    try:
        return serve_fingerprint(record.manifests)
    except (StopIteration, KeyError, IndexError):
        return None


def serves_like(record: ReleaseRecord, serve_print: str) -> bool:
    return record.drafter == NO_DRAFTER and record_serve_print(record) == serve_print


def bench_revision(
    run: GateRun, request: PlanRequest, revision: int, serve_print: str | None = None
) -> StoredBench:
    """Run the bench workload against the serving revision and keep its result in the cluster,
    labelled with the revision's serve fingerprint (`serve_print`; default the gate's: a
    switched-off revision's own keeps it from being taken later for a plain baseline)."""
    session, gate, reporter = run.session, run.gate, run.reporter
    bench_request = PlanRequest(
        "bench",
        gate.cluster,
        request.drafter,
        request.overrides,
        ask=BenchAsk(
            concurrency=gate.bench_concurrency, synthetic=request.asked(ServeAsk).synthetic
        ),
    )
    started = batch_runs.start_run(session, run.loaded, bench_request, reporter)
    try:
        snapshot = batch_runs.follow_run(
            session, started.job, started.run_id, reporter, poll_s=run.bench_poll_s
        )
    except RolloutError as exc:
        raise GateMeasurementError(f"bench run {started.run_id} failed: {exc.message}") from exc
    try:
        result = bench_result(snapshot)
    except BenchResultError as exc:
        raise GateMeasurementError(
            f"bench run {started.run_id}'s result line is not a bench result: {exc} (was the "
            "bench image's kimideploy another version than the CLI's?)"
        ) from exc
    if result is None:
        raise GateMeasurementError(
            f"bench run {started.run_id} finished without a result line in its log "
            "(was the bench image's kimideploy too old?)"
        )
    measured_on = MeasuredOn(
        release=gate.release,
        drafter=request.drafter or NO_DRAFTER,
        cluster=gate.cluster,
        image=gate.image,
        revision=revision,
        serve_fingerprint=serve_print or gate.serve_print,
        bench_fingerprint=gate.bench_print,
    )
    return _keep(session, started.run_id, result, measured_on)


def _keep(
    session: ClusterSession, run_id: str, result: BenchResult, measured_on: MeasuredOn
) -> StoredBench:
    """The one place a bench result becomes a stored one: dated by the API server's clock."""
    stored = StoredBench(
        **asdict(measured_on),
        run_id=run_id,
        measured_at=_now(session).strftime("%Y-%m-%dT%H:%M:%S%z"),
        result=result,
    )
    session.store_bench(stored)
    return stored


def _bench_spec(rendered: Rendered) -> BenchSpec:
    spec = rendered.plan.spec
    assert isinstance(spec, BenchSpec), rendered.plan.workload
    return spec


LATEST_BASELINE = "latest"


def choose_bench_baseline(
    session: ClusterSession, loaded: LoadedProject, request: PlanRequest, wanted: str
) -> tuple[StoredBench, str]:
    """The stored non-speculative run `run bench --baseline` compares with: `latest` picks the
    newest comparable one as the gate would; a run id must be comparable too. Chosen before the
    bench Job exists, so a wrong choice costs nothing."""
    rendered = render_workload(loaded, request, session.answers)
    spec, release = _bench_spec(rendered), rendered.plan.serve_release
    serving = serving_record(session, release)
    if serving is None:
        raise UsageError(
            f"nothing is deployed in release {release}, so there is nothing to bench",
            hint="`kimideploy up serve --drafter D` first",
        )
    stored = session.bench_results(release)
    comparable = partial(
        pick_baseline,
        cluster=serving.cluster,
        serve_print=_fingerprint_of(serving),
        bench_print=bench_fingerprint(
            spec.prompt_sets, spec.num_prompts, spec.max_tokens, _plan_files(spec.prompt_files)
        ),
        needed=[(p, c) for p in spec.prompt_sets for c in spec.concurrency],
        now=_now(session),
    )
    listing = "`kimideploy bench list` shows the stored runs"
    if wanted == LATEST_BASELINE:
        max_age_h = loaded.project.clusters[serving.cluster].gate.baseline_max_age_h
        chosen, why = comparable(stored, max_age_h=max_age_h)
        if chosen is None:
            raise UsageError(
                f"no comparable non-speculative bench run to compare with: {why}",
                hint="measure one with `kimideploy up serve --drafter none` then `kimideploy run "
                f"bench`, or name a run with --baseline RUN_ID; {listing}",
            )
        return chosen, why
    named = next((b for b in stored if b.run_id == wanted), None)
    if named is None:
        raise UsageError(f"no stored bench run {wanted} of release {release}", hint=listing)
    if named.drafter != NO_DRAFTER:
        raise UsageError(
            f"bench run {wanted} measured drafter {named.drafter}; a baseline must be "
            "non-speculative (drafter none)",
            hint=listing,
        )
    chosen, why = comparable([named], max_age_h=float("inf"))
    if chosen is None:
        raise UsageError(
            f"bench run {wanted} does not compare with this one: {why}",
            hint=f"bench a baseline with the current settings; {listing}",
        )
    return chosen, f"baseline run {wanted} measured {named.measured_at}"


def bench_result(snapshot: JobSnapshot) -> BenchResult | None:
    """The bench pod's result event, parsed once into the value every reader takes; None when the
    pod printed none. Raises BenchResultError when the line is not a bench result."""
    event = progress.results(snapshot.logs).get(0)
    return None if event is None else BenchResult.from_dict(event)


def finished_bench(snapshot: JobSnapshot) -> BenchResult:
    """`run bench`'s result, or a RolloutError that says why there is none."""
    try:
        result = bench_result(snapshot)
    except BenchResultError as exc:
        raise RolloutError(
            f"the bench run's result line is not a bench result: {exc}",
            hint="was the bench image's kimideploy another version than the CLI's? "
            "`kimideploy logs RUN_ID` shows the bench pod's log",
        ) from exc
    if result is None:
        raise RolloutError(
            "the bench run finished without a result line in its log",
            hint="`kimideploy logs RUN_ID` shows the bench pod's log",
        )
    return result


def bench_comparison(result: BenchResult, baseline: StoredBench | None) -> list[dict[str, Any]]:
    """The finished bench run's table, over the chosen baseline when there is one."""
    return compare_with_baseline(result, baseline.result if baseline else None)


def record_bench_run(
    session: ClusterSession,
    started: batch_runs.RunStarted,
    result: BenchResult,
    reporter: Reporter,
) -> StoredBench | None:
    """Keep a `run bench` result like the gate's own, labelled with what was actually serving,
    so a manual non-speculative run can serve as the gate's baseline."""
    spec, release = _bench_spec(started.rendered), started.rendered.plan.serve_release
    serving = serving_record(session, release)
    if serving is None:
        return None
    if serving.drafter != spec.drafter:
        reporter.info(
            f"note: the run was labelled drafter {spec.drafter} but revision {serving.revision} "
            f"serves {serving.drafter}; it is stored as {serving.drafter}"
        )
    measured_on = MeasuredOn(
        release=release,
        drafter=serving.drafter,
        cluster=serving.cluster,
        image=serving.image,
        revision=serving.revision,
        serve_fingerprint=_fingerprint_of(serving),
        bench_fingerprint=bench_fingerprint(
            spec.prompt_sets, spec.num_prompts, spec.max_tokens, _plan_files(spec.prompt_files)
        ),
    )
    stored = _keep(session, started.run_id, result, measured_on)
    reporter.info(f"stored bench run {started.run_id} (drafter {serving.drafter}) for the gate")
    return stored


def _fingerprint_of(record: ReleaseRecord) -> str:
    """A speculative revision compares with the non-speculative render of the same config."""
    if record.drafter == NO_DRAFTER:
        return serve_fingerprint(record.manifests)
    return serve_fingerprint(deploy.non_speculative_revision(record).manifests)


def _measure_and_judge(
    run: GateRun, request: PlanRequest, revision: int, baseline: StoredBench | None, *, note: str
) -> Verdict:
    gate = run.gate
    settings = gate.settings
    base_run = baseline.run_id if baseline else None
    measured: StoredBench | None = None
    try:
        measured = bench_revision(run, request, revision)
        if baseline is None:
            raise GateMeasurementError(note)
        keep, reason, levels = judge(
            measured.result, baseline.result, gate.needed, settings.min_speedup
        )
        decision = KEEP if keep else ROLLBACK
        return Verdict(
            decision,
            reason,
            settings.min_speedup,
            levels,
            measured.run_id,
            base_run,
            note,
            kernels=measured.result.kernels,
        )
    except GateMeasurementError as exc:
        run_id = measured.run_id if measured else None
        return Verdict(
            KEEP if settings.fail_open else ROLLBACK,
            f"gate failed: {exc}",
            settings.min_speedup,
            [],
            run_id,
            base_run,
            note,
            gate_failed=True,
            fail_open=settings.fail_open,
            kernels=measured.result.kernels if measured else None,
        )


def _record_verdict(session: ClusterSession, release: str, revision: int, verdict: Verdict) -> None:
    """Under the lock, on the record as it is now (the update is conditional on it)."""
    with session.lock(release, "gate verdict"):
        record = next((r for r in session.history(release) if r.revision == revision), None)
        if record is not None:
            record.details = {**record.details, "gate": verdict.details()}
            session.record(record, new=False)


def _roll_back(
    run: GateRun, revision: int, verdict: Verdict, judged: OutcomeFacts
) -> deploy.Outcome:
    try:
        target = deploy.RollbackTo(
            no_spec=True,
            note=f"gate rollback of revision {revision}: {verdict.reason}",
            expect_serving=revision,
        )
        unattended = run.apply.unattended(auto_rollback=False)
        return deploy.rollback(run.session, run.gate.release, target, unattended, run.reporter)
    except deploy.StaleRollbackError as exc:
        # Someone else's revision serves now: the drafter's revision is gone all the same.
        raise GateRejectedError(
            f"gate: {verdict.reason}; but {exc.message}",
            exc.hint,
            outcome={**judged, "status": "gate-rejected-superseded"},
        ) from exc
    except KimiDeployError as exc:
        raise RolloutError(
            f"gate: {verdict.reason}; the rollback to non-speculative serving failed too: "
            f"{exc.message}",
            hint="`kimideploy rollback serve --no-spec` retries it",
            outcome={
                **judged,
                "status": "gate-rollback-failed",
                "serving_revision": exc.outcome.get("serving_revision"),
            },
        ) from exc


def judge_serving(
    session: ClusterSession,
    loaded: LoadedProject,
    request: PlanRequest,
    options: GateOptions,
    *,
    reporter: Reporter,
) -> tuple[str, Verdict]:
    """The gate without applying anything (GitOps): the release that serves now, applied by Argo
    CD or Flux from `render --kustomize`, must be request's render and rolled out; it is benched
    and judged against the stored non-speculative baseline. Nothing is rolled back or recorded on
    a revision: the caller (a pipeline) reverts the commit when the verdict says so."""
    gate, revision = _serving_gate(session, loaded, request, options)
    baseline, why = stored_baseline(session, gate)
    if baseline is None:
        raise UsageError(
            f"gate: {why}; there is nothing to compare {request.drafter} with",
            hint="sync the non-speculative render (`render serve --drafter none --kustomize`) "
            "and run `kimideploy gate serve --drafter none` (it measures the baseline), then "
            "sync the drafter again",
        )
    reporter.info(f"gate: comparing with {why}")
    run = GateRun(session, loaded, gate, reporter, bench_poll_s=options.bench_poll_s)
    verdict = _measure_and_judge(run, request, revision, baseline, note=why)
    reporter.info(f"gate: {request.drafter} {verdict.summary()}")
    return gate.release, verdict


def measure_serving_baseline(
    session: ClusterSession,
    loaded: LoadedProject,
    request: PlanRequest,
    options: GateOptions,
    *,
    reporter: Reporter,
) -> StoredBench:
    """`gate serve --drafter none`: bench the non-speculative release GitOps applied (it must be
    this render, rolled out) and store the result as the gate's baseline."""
    gate, revision = _serving_gate(session, loaded, request, options)
    try:
        run = GateRun(session, loaded, gate, reporter, bench_poll_s=options.bench_poll_s)
        stored = bench_revision(run, request, revision)
    except GateMeasurementError as exc:
        raise RolloutError(
            f"gate: the baseline could not be measured: {exc}",
            hint="`kimideploy logs RUN_ID` shows the bench pod's log",
        ) from exc
    reporter.info(f"gate: stored bench run {stored.run_id} as the non-speculative baseline")
    return stored


def _serving_gate(
    session: ClusterSession, loaded: LoadedProject, request: PlanRequest, options: GateOptions
) -> tuple[GateTerms, int]:
    """The gate's context for what serves now, after checking it is request's render and rolled
    out; and the kimideploy revision it is (0 when GitOps applied it, so there is none)."""
    gate = gate_terms(session, loaded, request, options)
    rendered = render_workload(loaded, request, session.answers)
    _require_serving(session, rendered, gate.release)
    record = serving_record(session, gate.release)
    return gate, record.revision if record else 0


def _require_serving(session: ClusterSession, rendered: Rendered, release: str) -> None:
    """The live Deployment is this render's (same spec hash) and fully rolled out."""
    wanted = next(o for o in rendered.objects if o["kind"] == "Deployment")
    # By name, not by field manager: Argo CD or Flux applied it, not kimideploy.
    live = session.get("Deployment", wanted["metadata"]["name"])
    if live is None:
        raise UsageError(
            f"{release} is not deployed in namespace {session.namespace}",
            hint="sync the drafter's overlay first (`render serve --drafter D --kustomize`)",
        )
    key = SPEC_SHA256_ANNOTATION
    expected = wanted["spec"]["template"]["metadata"]["annotations"][key]
    found = (live["spec"]["template"]["metadata"].get("annotations") or {}).get(key)
    if found != expected:
        raise UsageError(
            f"{release} in namespace {session.namespace} is not this render (spec {str(found)[:12]}"
            f", the render's is {expected[:12]}): benching it would judge another configuration",
            hint="sync the commit that holds this render, or pass the --drafter/--set it was "
            "rendered with",
        )
    status, replicas = live.get("status") or {}, live["spec"].get("replicas", 1)
    rolled_out = (
        status.get("observedGeneration", 0) >= live["metadata"].get("generation", 0)
        and status.get("updatedReplicas", 0) >= replicas
        and status.get("availableReplicas", 0) >= replicas
    )
    if not rolled_out:
        raise UsageError(
            f"{release} is still rolling out ({status.get('updatedReplicas', 0)}/{replicas} "
            f"updated, {status.get('availableReplicas', 0)} available)",
            hint="wait for the sync to finish (e.g. `argocd app wait --health`), then gate again",
        )


def _plan_files(pod_paths: dict[str, str]) -> dict[str, str]:
    """The spec's prompt files as the config names them (relative to the datasets volume), so a
    bench spec and the settings give the same fingerprint."""
    return {n: p.removeprefix(f"{DATASETS_MOUNT}/") for n, p in pod_paths.items()}
