"""vLLM's speculative-decoding counters read live from the serve pods, and the watch that acts on
them: acceptance over each interval compared with the cluster's break-even rate
(docs/reference/domain.md §6)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from kimideploy.cluster.records import ReleaseRecord
from kimideploy.cluster.session import ClusterSession
from kimideploy.config.drafters import NO_DRAFTER
from kimideploy.config.gate import WatchSettings
from kimideploy.config.loading import LoadedProject, load_project_text
from kimideploy.errors import KimiDeployError, UsageError
from kimideploy.formats.vllm_metrics import acceptance, summed
from kimideploy.plan.calibration import Calibration
from kimideploy.plan.model import ClusterAnswers, PlanRequest
from kimideploy.plan.resolve import resolve
from kimideploy.plan.step_cost import uncalibrated
from kimideploy.services.release import deploy, lifecycle
from kimideploy.services.reporting import Reporter


@dataclass(frozen=True)
class ServingFacts:
    """What the serving revision's own stored config says about judging its acceptance."""

    record: ReleaseRecord
    port: int
    num_speculative_tokens: int
    break_even: float
    break_even_source: str


def serving_facts(
    record: ReleaseRecord, calibrations: tuple[Calibration, ...] = ()
) -> ServingFacts | None:
    """None when the revision serves without a drafter (there is no acceptance to judge).

    Break-even comes from the revision's own config re-resolved with the cluster's calibrations:
    the measured step cost when one applies to what the revision serves, at the lowest gated
    concurrency (the lowest bar: watch must not roll back a drafter that pays there)."""
    if record.drafter == NO_DRAFTER:
        return None
    project = load_project_text(record.config_text, Path(f"revision-{record.revision}.yaml"))
    drafter = project.project.drafters[record.drafter]
    deployment = next(o for o in record.manifests if o["kind"] == "Deployment")
    ports = deployment["spec"]["template"]["spec"]["containers"][0].get("ports") or [{}]
    k = drafter.num_speculative_tokens
    costs = uncalibrated(project.project, record.cluster)
    even, source = (costs.cost(k, 1) - 1) / k, costs.source
    with contextlib.suppress(KimiDeployError, KeyError, ValueError):
        request = PlanRequest("serve", record.cluster, record.drafter, tuple(record.overrides))
        answered = ClusterAnswers(calibrations=calibrations)
        plan = resolve(project, request, answered).break_even
        lowest = min(plan["rate"], key=int)
        even, source = plan["rate"][lowest], f"{plan['source']} (c={lowest})"
    return ServingFacts(record, int(ports[0].get("containerPort", 8000)), k, even, source)


def scrape_serve_pods(
    session: ClusterSession, release: str, port: int, component: str = "serve"
) -> tuple[dict[str, str], list[str]]:
    """Each running serve pod's /metrics through the API server; (texts by pod, errors). The
    release's own pods by default: not a canary's, nor the endpoint pickers' (plan/gateway.py)."""
    texts, errors = {}, []
    selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component={component}"
    for pod in session.pods(selector):
        name = pod["metadata"]["name"]
        if pod.get("status", {}).get("phase") != "Running":
            continue
        try:
            texts[name] = session.scrape_pod(name, port)
        except KimiDeployError as exc:
            errors.append(f"{name}: {exc.message}")
    return texts, errors


def live_acceptance(session: ClusterSession, record: ReleaseRecord) -> dict[str, Any]:
    """Acceptance since the serve pods started (lifetime counters), for `status`."""
    facts = serving_facts(record, session.calibrations_of(record.cluster))
    if facts is None:
        return {"acceptance": "no drafter"}
    texts, errors = scrape_serve_pods(session, record.release, facts.port)
    total = summed([a for a in (acceptance("", t) for t in texts.values()) if a is not None])
    shown: dict[str, Any] = {
        "break_even_rate": round(facts.break_even, 4),
        "break_even_from": facts.break_even_source,
    }
    if total is None or total.rate is None:
        reason = "; ".join(errors) or "no speculative-decoding counters yet"
        return {**shown, "acceptance": f"unavailable ({reason})"}
    below = " BELOW break-even" if total.rate < facts.break_even else ""
    return {
        **shown,
        "acceptance": f"{total.rate:.1%} since pod start{below}",
        "acceptance_rate": round(total.rate, 4),
        "mean_acceptance_length": round(total.mean_acceptance_length or 0, 3),
        "per_position_acceptance": [round(r, 4) for r in total.per_position_rate],
        "per_position_basis": total.per_position_basis,
        # Live traffic has no requests of its own to ask: the counters are all of it.
        "counted_by": "scraped",
        "pods_scraped": len(texts),
    }


COLLAPSED_LENGTH = 1.05
"""Mean acceptance length (tokens per verification step) below which a drafter accepts almost
nothing. The failure reported after weight syncs and engine changes (sglang#31674, #27718):
acceptance falls to ~1.0 with no error, which a break-even rule only catches when break-even is
above it and only after its windows."""


def swapped_at(record: ReleaseRecord) -> datetime | None:
    """When the revision put a drafter into running pods (a swap, or speculation switched on);
    None for a revision that started its pods (the drafter check ran before its load)."""
    swap, switch = record.details.get("swap"), record.details.get("switch")
    switched_on = isinstance(switch, dict) and switch.get("speculation") == "on"
    if not isinstance(swap, dict) and not switched_on:
        return None
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(record.created_at)
    return None


@dataclass
class AcceptanceWatch:
    """Acceptance per interval, summed over pods; a restarted pod's counters start again."""

    break_even: float
    settings: WatchSettings
    guard_until: float = 0.0
    """Until this time (epoch seconds) a collapsed window acts at once (`collapse_guard_s` after a
    swap); 0: no swap to guard."""
    previous: dict[str, str] = field(default_factory=dict)
    below: int = 0
    reading: dict[str, Any] = field(default_factory=dict)
    """The last window as figures (`watch -o json` prints one per window): pods scraped, the
    errors, acceptance and draft tokens where there was a window, and the verdict."""

    def observe(self, texts: dict[str, str], errors: list[str]) -> tuple[str, bool]:
        """(a line for the person watching, whether to act now); `reading` holds its figures."""
        parts = []
        for pod, text in texts.items():
            before = self.previous.get(pod, "")
            window = acceptance(before, text)
            if window is not None and window.drafts < 0:  # the pod restarted: counters reset
                window = acceptance("", text)
            if window is not None and pod in self.previous:
                parts.append(window)
        self.previous = dict(texts)
        total = summed(parts)
        trouble = f"; unavailable: {'; '.join(errors)}" if errors else ""
        self.reading = {"pods_scraped": len(texts), "errors": list(errors),
                        "break_even_rate": round(self.break_even, 4)}  # fmt: skip
        if total is None or total.rate is None:
            self.reading["verdict"] = "no-window"
            return f"acceptance: no window yet ({len(texts)} pods scraped{trouble})", False
        self.reading.update(acceptance_rate=round(total.rate, 4),
                            draft_tokens=round(total.draft_tokens))  # fmt: skip
        rate = f"acceptance {total.rate:.1%} over {total.draft_tokens:.0f} draft tokens"
        even = f"break-even {self.break_even:.1%}"
        if total.draft_tokens < self.settings.min_draft_tokens:
            needed = self.settings.min_draft_tokens
            self.reading["verdict"] = "too-few-to-judge"
            return f"{rate} (too few to judge, < {needed}); {even}{trouble}", False
        length = total.mean_acceptance_length
        if length is not None and length < COLLAPSED_LENGTH and time.time() < self.guard_until:
            self.reading["verdict"] = "collapsed-after-swap"
            self.reading["mean_acceptance_length"] = round(length, 4)
            return (
                f"{rate}; mean acceptance length {length:.3f} < {COLLAPSED_LENGTH} right after a "
                f"swap: COLLAPSED (the drafter accepts almost nothing){trouble}"
            ), True
        if total.rate >= self.break_even:
            self.below = 0
            self.reading["verdict"] = "paying"
            return f"{rate}; {even}: paying{trouble}", False
        self.below += 1
        self.reading.update(verdict="below-break-even", windows_below=self.below,
                            windows_to_act=self.settings.windows_below)  # fmt: skip
        line = (
            f"{rate}; {even}: BELOW break-even "
            f"({self.below}/{self.settings.windows_below} windows){trouble}"
        )
        return line, self.below >= self.settings.windows_below


def watch_release(
    session: ClusterSession,
    loaded: LoadedProject,
    reporter: Reporter,
    max_windows: int | None = None,
    *,
    interval_s: float | None = None,
    act: bool | None = None,
    on_window: Callable[[dict[str, Any]], None] | None = None,
) -> str:
    """Scrape every interval until stopped; flag, or roll back, a drafter below break-even.
    `on_window` gets each window's figures (AcceptanceWatch.reading) with its number, time and
    what was done about it."""
    release = loaded.project.release_name("serve")
    serving = lifecycle.serving(session.history(release))
    if serving is None:
        raise UsageError(f"{release} is not serving in namespace {session.namespace}")
    facts = serving_facts(serving, session.calibrations_of(serving.cluster))
    if facts is None:
        raise UsageError(
            f"revision {serving.revision} serves without a drafter; there is nothing to watch"
        )
    cluster = loaded.project.clusters.get(serving.cluster)
    settings = cluster.gate.watch if cluster else WatchSettings()
    if act is not None:
        settings = settings.model_copy(update={"action": "rollback" if act else "flag"})
    interval = settings.interval_s if interval_s is None else interval_s
    swapped = swapped_at(serving)
    guard_until = 0.0
    if swapped is not None and settings.collapse_guard_s:
        guard_until = swapped.timestamp() + settings.collapse_guard_s
    watch = AcceptanceWatch(facts.break_even, settings, guard_until=guard_until)
    reporter.info(
        f"watching revision {serving.revision} ({serving.drafter}, k="
        f"{facts.num_speculative_tokens}) every {interval:g}s; break-even acceptance "
        f"{facts.break_even:.1%} (step cost: {facts.break_even_source}); on "
        f"{settings.windows_below} windows below it: {settings.action}"
        + (
            f"; a swap: one window below {COLLAPSED_LENGTH} tokens per step until "
            f"{time.strftime('%H:%M:%S', time.localtime(guard_until))} acts at once"
            if guard_until > time.time()
            else ""
        )
    )
    windows = 0
    while max_windows is None or windows < max_windows:
        texts, errors = scrape_serve_pods(session, release, facts.port)
        line, act_now = watch.observe(texts, errors)
        reporter.info(f"[{time.strftime('%H:%M:%S')}] {line}")
        windows += 1
        if on_window is not None:
            action = settings.action if act_now else None
            on_window({"window": windows, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "revision": serving.revision, "drafter": serving.drafter,
                       **watch.reading, "action": action})  # fmt: skip
        if act_now:
            reason = (
                f"acceptance collapsed right after a swap ({line})"
                if watch.reading.get("verdict") == "collapsed-after-swap"
                else f"acceptance below the break-even rate {facts.break_even:.1%} for "
                f"{settings.windows_below} windows in a row ({line})"
            )
            if settings.action == "flag":
                reporter.info(f"ALERT: revision {serving.revision} ({serving.drafter}): {reason}")
                watch.below = 0
            else:
                note = f"watch rollback of revision {serving.revision}: {reason}"
                deploy.rollback(
                    session,
                    release,
                    deploy.RollbackTo(no_spec=True, note=note),
                    deploy.ApplyOptions().unattended(),
                    reporter,
                )
                return f"rolled back to non-speculative serving: {reason}"
        if max_windows is None or windows < max_windows:
            time.sleep(interval)
    return f"watched {windows} windows"
