"""`up serve --drafter X --canary P`: a canary pool beside the serving one on the cluster's
gateway, judged on live traffic, and the route's weight moved to 100 or 0 by the verdict.

The canary revision is the serving revision's objects with the canary's beside them (its
Deployment of one pod, spec ConfigMap, InferencePool and endpoint picker) and the HTTPRoute
splitting the traffic; a verdict is one more revision that changes only the route's weights. So
`history` lists each step, and `rollback serve` of a canary revision returns to the revision
before it: the canary's objects are pruned and the route sends everything to the release.

What the judge can read of live traffic. vLLM 0.32 reports a request's own acceptance only in
that request's response body (`--per-request-spec-decode-metrics`; config/observability.py: "the
per-request response-body counterpart of the aggregate vllm:spec_decode_* Prometheus metrics"),
which only the client sees. Outside the client's path the judge reads each pool's /metrics
through the API server's pod proxy, twice a window apart: acceptance from the
speculative-decoding counters (counted_by "scraped"), and speed from the per-request histogram
vLLM keeps, `vllm:request_time_per_output_token_seconds` (each finished request observes its own
mean time per output token, so its sum over its count is a per-request mean, not biased towards
long completions).

A pool with less load per pod decodes faster whatever its drafter (a smaller batch per step), and
the canary's pod takes P% of the traffic alone. The speeds are therefore compared only when the
two pools' finished requests per pod are within LOAD_RATIO of each other; otherwise the verdict
rests on acceptance against the break-even rate and says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from kimideploy.cluster.session import ClusterSession
from kimideploy.config.clusters import CanaryJudgement
from kimideploy.config.drafters import NO_DRAFTER
from kimideploy.config.loading import LoadedProject
from kimideploy.errors import UsageError
from kimideploy.formats.vllm_metrics import Acceptance, acceptance, parse, summed
from kimideploy.plan.gateway import with_canary_share
from kimideploy.plan.inputs import CANARY_SUFFIX
from kimideploy.render.manifests import sort_for_apply
from kimideploy.services.release import deploy, lifecycle
from kimideploy.services.release.watch import scrape_serve_pods
from kimideploy.services.rendering import Rendered
from kimideploy.services.reporting import Reporter

TPOT = "vllm:request_time_per_output_token_seconds"
LOAD_RATIO = 1.5
"""The most two pools' finished requests per pod may differ for their speeds to be compared."""


@dataclass(frozen=True)
class PoolWindow:
    """What one pool's pods did between two scrapes."""

    pods: int
    requests: float
    """Finished requests (the per-request histogram's count)."""
    seconds_per_token: float | None
    """Mean over finished requests of each one's time per output token."""
    acceptance: Acceptance | None

    @property
    def requests_per_pod(self) -> float:
        return self.requests / self.pods if self.pods else 0.0


def _histogram(text: str, name: str) -> tuple[float, float]:
    """(sum, count) over every series of a histogram."""
    samples = parse(text)
    total = sum(samples.get(f"{name}_sum", {}).values())
    count = sum(samples.get(f"{name}_count", {}).values())
    return total, count


def pool_window(before: dict[str, str], after: dict[str, str]) -> PoolWindow:
    """The pool's requests, speed and acceptance between two scrapes of its pods; a pod that
    was not in the first scrape, or restarted in between, counts from its start."""
    seconds = requests = 0.0
    parts = []
    for pod, text in after.items():
        first = before.get(pod, "")
        (s1, c1), (s2, c2) = _histogram(first, TPOT), _histogram(text, TPOT)
        if c2 < c1:  # the pod restarted: its counters began again
            first, s1, c1 = "", 0.0, 0.0
        seconds, requests = seconds + s2 - s1, requests + c2 - c1
        window = acceptance(first, text)
        if window is not None:
            parts.append(window)
    return PoolWindow(
        pods=len(after),
        requests=requests,
        seconds_per_token=seconds / requests if requests else None,
        acceptance=summed(parts),
    )


@dataclass(frozen=True)
class CanaryVerdict:
    promote: bool
    reason: str
    stable: PoolWindow
    canary: PoolWindow
    speed_compared: bool

    @property
    def weight(self) -> int:
        return 100 if self.promote else 0

    kind = "canary"

    def summary(self) -> str:
        return f"{'promoted' if self.promote else 'refused'} ({self.reason})"

    def details(self) -> dict[str, Any]:
        def pool(window: PoolWindow) -> dict[str, Any]:
            rate = window.acceptance.rate if window.acceptance else None
            return {
                "pods": window.pods,
                "requests": window.requests,
                "seconds_per_token": window.seconds_per_token,
                "acceptance_rate": rate,
                "counted_by": "scraped",
            }

        return {
            "kind": "canary",
            "promote": self.promote,
            "canary_weight": self.weight,
            "reason": self.reason,
            "speed_compared": self.speed_compared,
            "stable": pool(self.stable),
            "canary": pool(self.canary),
        }


def verdict(
    stable: PoolWindow,
    canary: PoolWindow,
    *,
    break_even: float | None,
    min_speedup: float,
    settings: CanaryJudgement,
) -> CanaryVerdict:
    """Promote (weight 100) only on enough requests in both pools, acceptance at or above the
    break-even rate (a speculative canary), and, where the loads are comparable, a speed at
    least `min_speedup` times the stable pool's. Anything unjudgeable refuses (weight 0)."""

    def refuse(reason: str, compared: bool = False) -> CanaryVerdict:
        return CanaryVerdict(False, reason, stable, canary, compared)

    fewest = min(stable.requests, canary.requests)
    if fewest < settings.min_requests:
        return refuse(
            f"too few finished requests to judge ({stable.requests:.0f} stable, "
            f"{canary.requests:.0f} canary; at least {settings.min_requests} each)"
        )
    said = []
    if break_even is not None:
        rate = canary.acceptance.rate if canary.acceptance else None
        if rate is None:
            return refuse("the canary's pods reported no speculative-decoding counters")
        if rate < break_even:
            return refuse(f"canary acceptance {rate:.1%} is below break-even {break_even:.1%}")
        said.append(f"acceptance {rate:.1%} >= break-even {break_even:.1%}")
    loads = sorted((stable.requests_per_pod, canary.requests_per_pod))
    comparable = loads[0] > 0 and loads[1] / loads[0] <= LOAD_RATIO
    if comparable and stable.seconds_per_token and canary.seconds_per_token:
        speedup = stable.seconds_per_token / canary.seconds_per_token
        if speedup < min_speedup:
            return refuse(
                f"canary per-request time per token {canary.seconds_per_token * 1000:.1f} ms vs "
                f"stable {stable.seconds_per_token * 1000:.1f} ms: speedup {speedup:.3f} < "
                f"{min_speedup}",
                compared=True,
            )
        said.append(f"speedup {speedup:.3f} >= {min_speedup}")
        return CanaryVerdict(True, "; ".join(said), stable, canary, True)
    if break_even is None:
        return refuse(
            "the pools' loads differ too much to compare their speeds "
            f"({stable.requests_per_pod:.0f} vs {canary.requests_per_pod:.0f} requests per pod), "
            "and a canary without a drafter has no acceptance to judge"
        )
    said.append(
        f"speeds not compared: {stable.requests_per_pod:.0f} vs "
        f"{canary.requests_per_pod:.0f} requests per pod (more than {LOAD_RATIO}x apart)"
    )
    return CanaryVerdict(True, "; ".join(said), stable, canary, False)


def canary_revision(
    session: ClusterSession, loaded: LoadedProject, rendered: Rendered
) -> deploy.Revision:
    """The serving revision's objects with the canary's (and the route's split) beside them."""
    plan = rendered.plan
    serving = lifecycle.serving(session.history(plan.release))
    if serving is None:
        raise UsageError(
            f"{plan.release} is not serving in namespace {session.namespace}: a canary takes a "
            "share of a serving release's traffic",
            hint="`kimideploy up serve` first (the canary then compares against it)",
        )
    if any(o["metadata"]["name"].endswith(CANARY_SUFFIX) for o in serving.manifests):
        raise UsageError(
            f"revision {serving.revision} of {plan.release} already has a canary",
            hint="let its verdict finish, or `kimideploy rollback serve` to remove it",
        )
    wanted = {(o["kind"], o["metadata"]["name"]) for o in rendered.objects}
    kept = [o for o in serving.manifests if (o["kind"], o["metadata"]["name"]) not in wanted]
    percent = plan.inputs.get("canary_percent")
    revision = deploy.revision_from_render(
        loaded,
        rendered,
        f"canary: {plan.drafter} takes {percent}% beside revision {serving.revision} "
        f"({serving.drafter})",
    )
    return replace(
        revision,
        manifests=sort_for_apply([*kept, *rendered.objects]),
        drafter=serving.drafter,
        follow=f"{plan.release}{CANARY_SUFFIX}",
        source_revision=serving.revision,
    )


def observe(
    session: ClusterSession,
    release: str,
    *,
    port: int,
    settings: CanaryJudgement,
    reporter: Reporter,
) -> tuple[PoolWindow, PoolWindow]:
    """Both pools over `settings.windows` windows, a line per window for the person waiting."""
    pools = ("serve", f"serve{CANARY_SUFFIX}")
    first = {c: scrape_serve_pods(session, release, port, c)[0] for c in pools}
    latest = first
    for window in range(1, settings.windows + 1):
        time.sleep(settings.window_s)
        latest = {}
        for component in pools:
            texts, errors = scrape_serve_pods(session, release, port, component)
            latest[component] = texts
            for error in errors:
                reporter.info(f"  unavailable: {error}")
        stable, canary = (pool_window(first[c], latest[c]) for c in pools)
        reporter.info(
            f"[{window}/{settings.windows}] stable: {describe(stable)} | canary: {describe(canary)}"
        )
    stable, canary = (pool_window(first[c], latest[c]) for c in pools)
    return stable, canary


def describe(window: PoolWindow) -> str:
    tpot = (
        f"{window.seconds_per_token * 1000:.1f} ms/token"
        if window.seconds_per_token is not None
        else "no requests"
    )
    rate = window.acceptance.rate if window.acceptance else None
    accepted = f", acceptance {rate:.1%}" if rate is not None else ""
    return f"{window.requests:.0f} requests on {window.pods} pods, {tpot}{accepted}"


def move_weight(
    session: ClusterSession,
    release: str,
    *,
    percent: int,
    note: str,
    options: deploy.ApplyOptions,
    reporter: Reporter,
) -> deploy.Outcome:
    """One more revision: the serving revision with the canary's share of the route set."""
    serving = lifecycle.serving(session.history(release))
    if serving is None or not any(o["kind"] == "HTTPRoute" for o in serving.manifests):
        raise UsageError(f"{release} serves no route to move")
    manifests = [
        with_canary_share(o, release, percent) if o["kind"] == "HTTPRoute" else o
        for o in serving.manifests
    ]
    revision = replace(
        deploy.revision_from_record(serving, note),
        manifests=manifests,
        follow=f"{release}{CANARY_SUFFIX}",
    )
    return deploy.deploy(
        session, revision, options.unattended(swap=False), reporter, action="canary"
    )


def run_canary(
    session: ClusterSession,
    loaded: LoadedProject,
    rendered: Rendered,
    *,
    options: deploy.ApplyOptions,
    reporter: Reporter,
) -> tuple[deploy.Outcome, CanaryVerdict | None]:
    """Apply the canary revision; once its pod is ready, judge it on live traffic and move the
    route's weight to 100 (promote) or 0 (refuse). --no-wait: apply and return."""
    revision = canary_revision(session, loaded, rendered)
    no_swap = replace(options, change=replace(options.change, swap=False))
    started = deploy.deploy(session, revision, no_swap, reporter, action="canary")
    if not started.waited:
        return started, None
    release = revision.release
    cluster = loaded.project.clusters[rendered.plan.cluster]
    gateway = cluster.gateway
    assert gateway is not None  # the plan refused a canary without one
    rates = rendered.plan.break_even.get("rate") or {}
    break_even = rates[min(rates, key=int)] if rates else None
    serving_drafter = revision.drafter
    min_speedup = cluster.gate.min_speedup if serving_drafter == NO_DRAFTER else 1.0
    reporter.info(
        f"judging the canary ({rendered.plan.drafter}) against revision "
        f"{revision.source_revision} ({serving_drafter}) on live traffic: "
        f"{gateway.canary.windows} windows of {gateway.canary.window_s}s"
    )
    port = cluster.workloads.serve.port
    stable, canary = observe(
        session, release, port=port, settings=gateway.canary, reporter=reporter
    )
    judged = verdict(
        stable, canary, break_even=break_even, min_speedup=min_speedup, settings=gateway.canary
    )
    word = "promoted: 100%" if judged.promote else "refused: 0%"
    moved = move_weight(
        session,
        release,
        percent=judged.weight,
        note=f"canary {rendered.plan.drafter} {word} ({judged.reason})",
        options=options,
        reporter=reporter,
    )
    return moved, judged
