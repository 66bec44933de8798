"""`kimideploy run bench --drafters none,ngram,suffix,k25`: one serve revision per candidate on
one cluster, each benched with the same settings, judged side by side (services/gate/bakeoff.py).

Order of work, as `run calibrate` (each model load is ~25 minutes on the real target):
1. render every candidate's revision and the bench first (the resolver's refusals, such as
   suffix decoding on an image without Arctic Inference, come before anything is created);
2. resume: a candidate whose stored bench run was measured on a revision that served exactly
   its render, with the same bench settings, is not loaded again;
3. say how many loads remain and how long they may take; confirm once;
4. per candidate: deploy, bench, store (the non-speculative run is what the gate later picks as
   its baseline);
5. with `--rounds N`, the candidates the serving pods can swap among themselves are benched
   N-1 times more, swapped in alternating order (services/gate/interleave.py), and judged by
   their mean over the rounds;
6. restore the revision that served before (or take the release down if nothing did), also
   after a failure; an interrupt says how to restore, and the same command resumes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kimideploy.cluster.bench_results import StoredBench
from kimideploy.cluster.session import ClusterSession
from kimideploy.config.drafters import NO_DRAFTER
from kimideploy.config.loading import LoadedProject
from kimideploy.errors import KimiDeployError, RolloutError, UsageError
from kimideploy.formats.bench_result import BenchResult
from kimideploy.plan.asks import ServeAsk
from kimideploy.plan.model import PlanRequest
from kimideploy.plan.resolve import serve_cost_model
from kimideploy.services.gate import interleave
from kimideploy.services.gate.bakeoff import Bakeoff, bakeoff, with_k_schedules
from kimideploy.services.gate.gating import (
    GateOptions,
    GateRun,
    GateTerms,
    bench_revision,
    gate_terms,
    record_serve_print,
    serving_record,
)
from kimideploy.services.gate.restore import restore_serving
from kimideploy.services.gate.verdict import GateMeasurementError, serve_fingerprint
from kimideploy.services.preflight import require_prerequisites
from kimideploy.services.release import deploy
from kimideploy.services.rendering import Rendered, render_workload
from kimideploy.services.reporting import Reporter


@dataclass(frozen=True)
class BakeoffPlan:
    cluster: str
    release: str
    candidates: dict[str, Rendered]
    """name -> its serve revision, `none` first."""
    gate: GateTerms
    startup_budget_s: int
    rounds: int = 1
    interleaved: list[str] = field(default_factory=list)
    """With rounds > 1: the candidates swapped among themselves round after round."""

    def describe(self, todo: list[str]) -> str:
        reused = [n for n in self.candidates if n not in todo]
        minutes = max(1, round(len(todo) * self.startup_budget_s / 60))
        levels = ", ".join(f"{p} c={c}" for p, c in self.gate.needed)
        again = f"; measured before, not loaded again: {', '.join(reused)}" if reused else ""
        rounds = (
            f"; then {self.rounds - 1} more round(s) of {', '.join(self.interleaved)} swapped in "
            "alternating order on the same server (no load)"
            if self.interleaved
            else ""
        )
        return (
            f"bake-off on {self.cluster}: {len(todo)} revision(s) ({', '.join(todo) or 'none'}; "
            f"a model load each unless it swaps the drafter, each up to the startup budget, "
            f"{minutes} min at most), one bench per revision at {levels}{again}{rounds}"
        )


def bakeoff_requests(
    cluster: str | None,
    candidates: tuple[str, ...],
    overrides: tuple[str, ...],
    image: str | None = None,
) -> dict[str, PlanRequest]:
    """One serve request per candidate, `none` first (what every speedup is over): resolved
    offline before any cluster is contacted, rendered again once connected."""
    names = list(dict.fromkeys((NO_DRAFTER, *candidates)))
    if len(names) < 2:
        raise UsageError(
            "--drafters: name at least one method or drafter besides none",
            hint="e.g. --drafters none,ngram,suffix,k25",
        )
    ask = ServeAsk(image=image)
    return {name: PlanRequest("serve", cluster, name, overrides, ask=ask) for name in names}


def plan_bakeoff(
    session: ClusterSession,
    loaded: LoadedProject,
    cluster: str | None,
    candidates: tuple[str, ...],
    *,
    overrides: tuple[str, ...],
    image: str | None = None,
    concurrency: tuple[int, ...] | None = None,
    rounds: int = 1,
) -> BakeoffPlan:
    """Render every candidate before anything is created; with rounds > 1, refuse unless at
    least two candidates can be swapped into one server (naming why the others cannot)."""
    requests = bakeoff_requests(cluster, candidates, overrides, image)
    rendered = {
        name: render_workload(loaded, request, session.answers)
        for name, request in requests.items()
    }
    gate = gate_terms(
        session,
        loaded,
        PlanRequest("serve", cluster, NO_DRAFTER, overrides, ask=ServeAsk(image=image)),
        GateOptions(concurrency=concurrency),
    )
    first = rendered[NO_DRAFTER].plan
    profile = loaded.project.clusters[first.cluster]
    plan = BakeoffPlan(
        first.cluster, first.release, rendered, gate, profile.workloads.serve.startup_budget_s
    )
    if rounds <= 1:
        return plan
    group, left_out = interleave.swap_group({n: r.objects for n, r in rendered.items()})
    if len(group) < 2:
        why = "; ".join(f"{n}: {r}" for n, r in left_out.items()) or "no drafter candidates"
        raise UsageError(
            f"--rounds {rounds}: no two candidates can be swapped into one running server ({why})",
            hint="interleaving needs drafters of one shape (same method, k, layers, vocabulary) "
            "on an image that swaps (vLLM >= 0.32, serve.drafter_swap); without --rounds each "
            "candidate is benched once",
        )
    return replace(plan, rounds=rounds, interleaved=group)


def measured_before(session: ClusterSession, plan: BakeoffPlan) -> dict[str, StoredBench]:
    """Per candidate, the newest stored bench run taken on a revision that served exactly its
    render, with this bake-off's bench settings."""
    history = {r.revision: r for r in session.history(plan.release)}
    found: dict[str, StoredBench] = {}
    for stored in session.bench_results(plan.release):
        rendered = plan.candidates.get(stored.drafter)
        record = history.get(stored.revision)
        if rendered is None or record is None or stored.bench_fingerprint != plan.gate.bench_print:
            continue
        if not stored.result.covers(plan.gate.needed):
            continue
        if record_serve_print(record) == serve_fingerprint(rendered.objects):
            found[stored.drafter] = stored
    return found


def run_bakeoff(
    session: ClusterSession,
    loaded: LoadedProject,
    plan: BakeoffPlan,
    apply: deploy.ApplyOptions,
    *,
    reporter: Reporter,
    bench_poll_s: float = 5.0,
) -> Bakeoff:
    """Carry out a plan from plan_bakeoff; the table of every candidate, measured or reused."""
    reusable = measured_before(session, plan)
    # An interleaved candidate is measured in this run's rounds, never from an earlier run.
    results = {n: s.result for n, s in reusable.items() if n not in plan.interleaved}
    todo = [name for name in plan.candidates if name not in results]
    reporter.info(plan.describe(todo))
    for name in todo:  # before the first write
        require_prerequisites(session, plan.candidates[name].objects, plan.cluster)
    found = serving_record(session, plan.release)
    before = f"revision {found.revision} ({found.drafter})" if found else "nothing"
    if todo and not (apply.change.yes or reporter.confirm(f"bake-off, then restore {before}?")):
        raise KimiDeployError("cancelled; nothing was changed", hint="pass --yes to skip this")
    if todo and session.ensure_namespace():
        reporter.info(f"created namespace {session.namespace}")
    gate_run = GateRun(session, loaded, plan.gate, reporter, bench_poll_s=bench_poll_s)
    unattended = apply.unattended()

    latest: int | None = None

    def restore() -> str:
        """What served before, back (read when called: `latest` moves as revisions apply)."""
        return restore_serving(
            session, plan.release, found, latest, apply=unattended, reporter=reporter,
            after="the bake-off",
        )  # fmt: skip

    try:
        for name in todo:
            revision = deploy.revision_from_render(
                loaded, plan.candidates[name], note=f"bake-off revision ({name})"
            )
            reporter.info(f"bake-off: deploying {name}")
            latest = deploy.deploy(
                session, revision, unattended, reporter, action="bake-off"
            ).revision
            results[name] = bench_revision(gate_run, _bench_request(plan, name), latest).result
        rounds: dict[str, list[BenchResult]] = {}
        if plan.interleaved:

            def serve(name: str) -> None:
                nonlocal latest
                revision = deploy.revision_from_render(
                    loaded, plan.candidates[name], note=f"bake-off round ({name})"
                )
                reporter.info(f"bake-off: swapping in {name}")
                latest = deploy.deploy(
                    session, revision, unattended, reporter, action="bake-off"
                ).revision

            def bench(name: str) -> BenchResult:
                assert latest is not None
                return bench_revision(gate_run, _bench_request(plan, name), latest).result

            orders = interleave.round_orders(plan.interleaved, plan.rounds)
            later = interleave.run_rounds(orders, todo[-1] if todo else None, serve, bench)
            rounds = {n: [results[n], *later[n]] for n in plan.interleaved}
            results.update({n: interleave.merge_rounds(r) for n, r in rounds.items()})
    except KeyboardInterrupt:
        back = (
            f"`kimideploy rollback serve --to {found.revision}` restores what served before"
            if found
            else "`kimideploy down serve` removes the bake-off revision"
        )
        reporter.info(
            f"interrupted: measured {sorted(results) or 'none'} (stored); {back}; "
            "the same `run bench --drafters` resumes"
        )
        raise
    except (KimiDeployError, GateMeasurementError) as exc:
        message = exc.message if isinstance(exc, KimiDeployError) else str(exc)
        raise RolloutError(
            f"bake-off stopped: {message}; {restore()}",
            hint="run the same `kimideploy run bench --drafters` again: measured candidates "
            f"({', '.join(sorted(results)) or 'none'}) are not loaded again",
        ) from exc
    reporter.info(restore())
    ordered = {name: results[name] for name in plan.candidates}
    judged = bakeoff(ordered, plan.gate.needed, plan.gate.settings.min_speedup)
    if rounds:
        judged = replace(judged, rounds=interleave.spread_lines(rounds, plan.gate.needed))
    return _k_schedules(session, loaded, plan, judged)


def _bench_request(plan: BakeoffPlan, name: str) -> PlanRequest:
    overrides = tuple(plan.candidates[name].plan.inputs["overrides"])
    return PlanRequest("serve", plan.cluster, name, overrides)


def _k_schedules(
    session: ClusterSession, loaded: LoadedProject, plan: BakeoffPlan, judged: Bakeoff
) -> Bakeoff:
    """Each EAGLE-3 candidate's k by batch size from what the table measured, against the
    cluster's stored calibration (without one, the schedule says to calibrate)."""
    eagle = loaded.project.eagle_drafters
    ks = {name: eagle[name].num_speculative_tokens for name in plan.candidates if name in eagle}
    if not ks:
        return judged
    costs, _, _ = serve_cost_model(loaded, plan.cluster, session.calibrations_of(plan.cluster))
    serve = plan.candidates[NO_DRAFTER].plan.spec
    max_num_seqs = loaded.project.clusters[plan.cluster].workloads.serve.max_num_seqs
    vllm = getattr(serve, "vllm_version", None)
    return with_k_schedules(judged, ks, costs, max_num_seqs, vllm=vllm)
