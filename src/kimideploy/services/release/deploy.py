"""up, rollback and down, each a recorded revision: this module orchestrates (lock, render,
validate, apply, follow, record); every decision about statuses and which revision to use is
lifecycle.py's."""

from __future__ import annotations

import getpass
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kimideploy.cluster.apply import ObjectRef, ref
from kimideploy.cluster.lock import ReleaseLock
from kimideploy.cluster.records import ReleaseRecord, UntrustedRecordError, secret_name
from kimideploy.cluster.rollout import RolloutState
from kimideploy.cluster.session import ClusterSession
from kimideploy.config.drafters import NO_DRAFTER
from kimideploy.config.loading import LoadedProject, load_project_text
from kimideploy.errors import KimiDeployError, OutcomeFacts, RolloutError, UsageError
from kimideploy.plan.asks import ServeAsk
from kimideploy.plan.inputs import CANARY_SUFFIX
from kimideploy.plan.model import ClusterAnswers, Plan, PlanRequest
from kimideploy.plan.refusal import drafter_refusal
from kimideploy.services.preflight import require_prerequisites, require_weights
from kimideploy.services.release import failures, lifecycle, swap
from kimideploy.services.release.changes import change_summary
from kimideploy.services.release.lifecycle import RevisionStatus
from kimideploy.services.rendering import Rendered, render_workload
from kimideploy.services.reporting import Reporter
from kimideploy.services.startup import StartupProgress, deployment_startup
from kimideploy.services.storage_probe import render_measured


@dataclass(frozen=True, kw_only=True)
class WaitOptions:
    wait: bool = True
    timeout_s: float = 3600
    poll_s: float = 2
    scheduling_grace_s: float = 120


@dataclass(frozen=True, kw_only=True)
class ChangeOptions:
    yes: bool = False
    force: bool = False
    auto_rollback: bool = True
    keep_history: int = 10
    swap: bool = True
    """Swap a new drafter into the running pods where only the drafter changes (swap.py)."""


@dataclass(frozen=True, kw_only=True)
class ApplyOptions:
    """How a revision is applied: the confirmation, force and rollback policy, and how the rollout
    is followed. One value from the CLI to every service that changes the release."""

    change: ChangeOptions = ChangeOptions()
    wait: WaitOptions = WaitOptions()

    def unattended(self, **change: Any) -> ApplyOptions:
        """The same, asking nobody (a gate, a calibration, an automatic rollback has had its
        one confirmation), with any other change options replaced."""
        return replace(self, change=replace(self.change, yes=True, **change))


@dataclass(frozen=True)
class Outcome:
    revision: int
    status: str
    message: str
    release: str
    waited: bool
    change: str = "rollout"
    """How the revision reached the pods (status.change_summary's words)."""
    startup: dict[str, Any] | None = None
    """The new pods' start-up by phase (formats/startup_phases.py); None where no pod started
    (a swap, a switch, --no-wait)."""


@dataclass(frozen=True, kw_only=True)
class RevisionFailure:
    """Why a revision did not serve, in the one shape its record, the message and the `-o json`
    outcome are made from."""

    release: str
    revision: int
    failure: str | None
    """The rollout watcher's name for it (CrashLoop, InitFailed, ...) or ApplyRejected."""
    reason: str
    log_tail: str = ""
    history: tuple[ReleaseRecord, ...] = ()
    """The release's revisions before this one: where an automatic rollback looks."""

    @property
    def message(self) -> str:
        text = f"revision {self.revision} failed: {self.reason}"
        if self.log_tail.strip():
            text += "\n  last log lines:\n    " + "\n    ".join(self.log_tail.strip().splitlines())
        what_to_do = failures.fix(self.failure)
        if what_to_do:
            text += f"\n  what to do ({self.failure}): {what_to_do}"
        return text

    def record_details(self) -> dict[str, Any]:
        return {"failure": self.failure, "reason": self.reason}

    def outcome(self, status: str) -> OutcomeFacts:
        """The `-o json` facts, saying nothing of what serves now."""
        return OutcomeFacts(status=status, release=self.release, revision=self.revision)

    def outcome_serving(self, status: str, serving_revision: int | None) -> OutcomeFacts:
        """The same, with what serves now (None: nothing does)."""
        return {**self.outcome(status), "serving_revision": serving_revision}


@dataclass(frozen=True)
class Revision:
    """What a new revision applies, and what it records about where it came from."""

    release: str
    workload: str
    manifests: list[dict[str, Any]]
    drafter: str
    image: str
    cluster: str
    config_sha256: str
    config_text: str
    overrides: list[str]
    note: str = ""
    source_revision: int | None = None
    preflight: tuple[dict[str, Any], ...] = ()
    """The weights probe of a fresh render (a rollback re-applies what was served: none)."""
    follow: str | None = None
    """The Deployment whose rollout says the revision is ready; None: the release's own (a
    canary revision follows the canary's)."""
    switch_off: Callable[[str], Revision] | None = None
    """For a non-speculative revision: the same revision as a server that keeps drafter D
    loaded with speculation switched off (swap.py). The transaction uses it where the pods
    last applied can switch and nothing else differs: seconds instead of a reload."""
    start_estimate_s: float | None = None
    """The engine start the plan predicted (plan/estimates.py), kept beside the measured one."""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def revision_from_render(loaded: LoadedProject, rendered: Rendered, note: str = "") -> Revision:
    plan = rendered.plan
    return Revision(
        release=plan.release,
        workload=plan.workload,
        manifests=rendered.objects,
        drafter=plan.drafter,
        image=plan.image,
        cluster=plan.cluster,
        config_sha256=loaded.sha256,
        config_text=loaded.text,
        overrides=list(plan.inputs["overrides"]),
        note=note,
        preflight=rendered.preflight,
        start_estimate_s=plan.engine_start_estimate_s or None,
    )


def up(
    session: ClusterSession,
    loaded: LoadedProject,
    request: PlanRequest,
    options: ApplyOptions,
    reporter: Reporter,
) -> Outcome:
    """Render, show the change, apply a new revision, follow the rollout, roll back on failure."""
    rendered = plan_up(session, loaded, request, options.change.force)
    return apply_up(session, loaded, rendered, options, reporter=reporter)


def plan_up(
    session: ClusterSession, loaded: LoadedProject, request: PlanRequest, force: bool
) -> Rendered:
    """The serve plan `up` applies, with what the cluster answered (its namespace, PodMonitors,
    calibrations), resolved once: a gated `up` reads its break-even from it and then applies it."""
    rendered = render_measured(session, loaded, request)
    refuse_failing_drafter(rendered.plan, force)
    return rendered


def apply_up(
    session: ClusterSession,
    loaded: LoadedProject,
    rendered: Rendered,
    options: ApplyOptions,
    *,
    reporter: Reporter,
) -> Outcome:
    for warning in rendered.plan.warnings:
        reporter.info(f"warning: {warning}")
    if not session.namespace_exists():
        # Nothing is created for a release that cannot apply; with the namespace there, the
        # transaction checks the prerequisites once, under the lock.
        require_prerequisites(session, rendered.objects, rendered.plan.cluster)
        if session.ensure_namespace():
            reporter.info(f"created namespace {session.namespace}")
    revision = revision_from_render(loaded, rendered)
    request = rendered.request
    form = switch_off_form(loaded, request, session.answers) if request else None
    return deploy(session, replace(revision, switch_off=form), options, reporter, action="up")


SWITCHED_OFF_NOTE = "speculation switched off in the running pods ({drafter} stays loaded)"


def switch_off_form(
    loaded: LoadedProject, request: PlanRequest, answers: ClusterAnswers
) -> Callable[[str], Revision] | None:
    """How a non-speculative serve revision is rendered as pods that keep drafter D loaded with
    speculation switched off (None: the request is not a non-speculative serve)."""
    ask = request.asked(ServeAsk)
    if (
        request.workload != "serve"
        or request.drafter != NO_DRAFTER
        or ask.canary_percent is not None
        or ask.synthetic is not None
    ):
        return None

    def form(drafter: str) -> Revision:
        switched = replace(request, drafter=drafter, ask=replace(ask, speculation_off=True))
        rendered = render_workload(loaded, switched, answers)
        revision = revision_from_render(loaded, rendered)
        return replace(revision, drafter=NO_DRAFTER, note=SWITCHED_OFF_NOTE.format(drafter=drafter))

    return form


def refuse_failing_drafter(plan: Plan, force: bool) -> None:
    refusal = drafter_refusal(plan, force)
    if refusal is not None:
        raise refusal


def deploy(
    session: ClusterSession,
    revision: Revision,
    options: ApplyOptions,
    reporter: Reporter,
    *,
    action: str,
) -> Outcome:
    """Apply one revision under the release lock; a failed rollout returns to the last good one.
    Every write is preceded by a fence (`lock.renew()`), and nothing is written before the server
    accepted every object in a dry run."""
    with session.lock(revision.release, action) as lock:
        return _Transaction(session, lock, options, reporter, action).apply(revision)


@dataclass(frozen=True)
class _Transaction:
    """One revision's application under a held release lock: what the steps share, so each step
    takes only what it decides on."""

    session: ClusterSession
    lock: ReleaseLock
    options: ApplyOptions
    reporter: Reporter
    action: str

    @property
    def change(self) -> ChangeOptions:
        return self.options.change

    @property
    def wait(self) -> WaitOptions:
        return self.options.wait

    def apply(self, revision: Revision) -> Outcome:
        """The revision, and when it fails to become ready, one automatic step back to the last
        good revision: a loop over at most two attempts, each the same `_attempt`. A rollback
        that fails too is reported as itself; nothing rolls back a rollback."""
        attempt, failed = self, None
        automatic = replace(self, options=self.options.unattended(), action="auto-rollback")
        while True:
            result = attempt._attempt(revision)
            if isinstance(result, Outcome):
                if failed is None:
                    return result
                raise RolloutError(
                    f"{failed.message}\nrolled back automatically: revision {result.revision} (a "
                    f"copy of revision {revision.source_revision}, drafter {revision.drafter}) is "
                    "now serving",
                    hint="`kimideploy history serve` shows both revisions",
                    outcome=failed.outcome_serving("rolled-back", result.revision),
                )
            if not attempt.change.auto_rollback or attempt.action == automatic.action:
                raise RolloutError(
                    result.message,
                    hint="`kimideploy rollback serve` returns to the last good revision",
                    outcome=result.outcome("failed"),
                )
            target = lifecycle.fallback_after_failure(list(result.history))
            if target is None:
                raise RolloutError(
                    result.message
                    + "\nno earlier good revision to roll back to; nothing is serving",
                    outcome=result.outcome("failed"),
                )
            self.reporter.info(
                f"{result.message}\nrolling back to revision {target.revision} "
                f"(drafter {target.drafter})"
            )
            failed, revision = (
                result,
                revision_from_record(
                    target,
                    f"automatic rollback to revision {target.revision} after "
                    f"revision {result.revision} failed: {result.failure}",
                ),
            )
            attempt = automatic

    def _attempt(self, revision: Revision) -> Outcome | RevisionFailure:
        """Apply one revision and follow it: the outcome when it is ready (or not waited for),
        what failed when its pods did not become ready. A refusal before anything is written, or
        an apply the API server rejects half-way, raises (nothing to roll back)."""
        session, change, reporter, lock = self.session, self.change, self.reporter, self.lock
        history = session.history(revision.release)
        number = lifecycle.next_revision(history)
        manifests, notes = session.keep_claim_sizes(revision.manifests)
        revision = replace(revision, manifests=manifests)
        for note in notes:
            reporter.info(f"note: {note}")
        require_prerequisites(session, revision.manifests, revision.cluster)
        for note in require_weights(session, revision.preflight, revision.cluster):
            reporter.info(note)
        serving = lifecycle.serving(history)
        applied = lifecycle.last_applied(history)
        plain = revision
        revision = self._switched_off(revision, applied)
        rendered = revision.manifests
        decision = swap.decide(applied.manifests if applied else None, rendered, change.swap)
        if decision.plan is not None:
            revision = replace(revision, manifests=decision.plan.manifests)
        session.validate(revision.manifests, force=change.force)
        live, existing = _existing(session, revision)
        if not self._confirm(revision, number, (live, existing), decision):
            raise KimiDeployError(
                "cancelled; nothing was changed",
                hint="pass --yes to skip the question",
                outcome={"status": "cancelled", "release": revision.release},
            )
        lock.renew()  # the confirmation may have outlasted the Lease
        record = _new_record(session, revision, number)
        session.record(record, new=True)
        self._apply_or_restore(revision, record, serving, existing)
        state = self._wait(revision)
        if decision.plan is not None and state is None:  # --no-wait: the keepers swap on their own
            speculation = "on" if decision.plan.speculation else "off"
            record.details[decision.plan.record_key] = {
                "outcome": "not waited for",
                "speculation": speculation,
            }
        elif decision.plan is not None and state is not None and state.phase == "ready":
            fallback = plain if revision is not plain else replace(revision, manifests=rendered)
            state = self._follow_swap(decision.plan, record, fallback)
        lock.renew()
        if state is None or state.phase == "ready":
            started = (
                self._startup(revision, record)
                if state is not None
                and "swap" not in record.details
                and "switch" not in record.details
                else None
            )
            _mark_serving(session, history, record, lifecycle.replaced_by(self.action))
            session.trim_history(revision.release, change.keep_history)
            how = "applied (not waited for)" if state is None else "ready"
            message = f"revision {number} of {revision.release} is {how}"
            return Outcome(
                number,
                RevisionStatus.DEPLOYED,
                message,
                revision.release,
                state is not None,
                change=change_summary(record),
                startup=started,
            )
        failure = RevisionFailure(
            release=revision.release,
            revision=number,
            failure=state.failure,
            reason=state.message,
            log_tail=self._failed_log_tail(state),
            history=tuple(history),
        )
        lifecycle.change_status(record, RevisionStatus.FAILED, failure.record_details())
        session.record(record, new=False)
        return failure

    def _switched_off(self, revision: Revision, applied: ReleaseRecord | None) -> Revision:
        return switched_off_form(revision, applied, self.change.swap)

    def _failed_log_tail(self, state: RolloutState) -> str:
        """The last lines of the failed pod's log: of the init container that failed, if one did."""
        if not state.pod:
            return ""
        failed_init = re.search(r"init container (\S+)", state.message)
        container = failed_init.group(1) if state.failure == "InitFailed" and failed_init else None
        return self.session.log(state.pod, tail=20, container=container)

    def _confirm(
        self,
        revision: Revision,
        number: int,
        objects: tuple[set[tuple[str, str]], set[tuple[str, str]]],
        decision: swap.SwapDecision,
    ) -> bool:
        live, existing = objects
        wanted = [ref(o) for o in revision.manifests]
        lines = [
            f"revision {number} of {revision.release} in namespace {self.session.namespace} "
            f"(drafter {revision.drafter}, {revision.image}):"
        ]
        if decision.plan is not None:
            checks = (
                "the server checks the files first, and a refusal replaces the pods"
                if decision.plan.speculation and decision.plan.serving != decision.plan.wanted
                else "the drafter's weights and KV cache stay allocated"
            )
            lines.append(
                f"  {decision.plan.what} (Deployment/{decision.plan.deployment} stays as it is: "
                f"no reload; {checks})"
            )
        elif decision.why_not:
            lines.append(f"  replace the pods, not a swap: {decision.why_not}")
        for target in wanted:
            verb = "configure" if (target.kind, target.name) in existing else "create"
            lines.append(f"  {verb} {target}")
        for kind, name in sorted(live - {(t.kind, t.name) for t in wanted}):
            lines.append(f"  prune {kind}/{name}")
        self.reporter.info("\n".join(lines))
        return self.change.yes or self.reporter.confirm(f"apply revision {number}?")

    def _apply_or_restore(
        self,
        revision: Revision,
        record: ReleaseRecord,
        serving: ReleaseRecord | None,
        existing: set[tuple[str, str]],
    ) -> None:
        """Apply and prune; if the API server rejects an object half-way (the dry run passed,
        then something changed: a quota filled, a webhook's answer), put back what the objects
        written so far were, mark the record failed and stop, so no new ConfigMap is left under
        old pods."""
        session = self.session
        self.lock.renew()
        written: list[ObjectRef] = []
        try:
            for obj in revision.manifests:
                session.apply([obj], force=self.change.force)
                written.append(ref(obj))
        except KimiDeployError as exc:
            restored = self._restore(written, serving, existing)
            rejected = RevisionFailure(
                release=revision.release,
                revision=record.revision,
                failure="ApplyRejected",
                reason=exc.message,
            )
            lifecycle.change_status(record, RevisionStatus.FAILED, rejected.record_details())
            session.record(record, new=False)
            raise exc.restated(
                f"revision {record.revision} was rejected while being applied: {exc.message}\n"
                f"{restored}",
                outcome=rejected.outcome_serving("failed", serving.revision if serving else None),
            ) from exc
        for pruned in session.prune(revision.release, keep=written):
            self.reporter.info(f"pruned {pruned}")

    def _restore(
        self,
        written: list[ObjectRef],
        serving: ReleaseRecord | None,
        existing: set[tuple[str, str]],
    ) -> str:
        """Undo the objects a rejected revision wrote: the serving revision's version back, and
        what it created removed (claims stay: they may already hold data)."""
        session = self.session
        before = {
            (o["kind"], o["metadata"]["name"]): o for o in (serving.manifests if serving else [])
        }
        try:
            for target in written:
                key = (target.kind, target.name)
                if key in before:
                    session.apply([before[key]], force=self.change.force)
                elif key not in existing and target.kind != "PersistentVolumeClaim":
                    session.delete(replace(target, namespace=session.namespace))
        except KimiDeployError as exc:
            return (
                f"putting back what it had written failed too ({exc.message}); "
                "see `kimideploy status`"
            )
        if not written:
            return "nothing had been written"
        if serving is None:
            return "no earlier revision was serving; the objects it had created were removed"
        return (
            f"what it had written ({', '.join(map(str, written))}) was put back: revision "
            f"{serving.revision} (drafter {serving.drafter}) is still serving"
        )

    def _follow_swap(
        self, plan: swap.SwapPlan, record: ReleaseRecord, fallback: Revision
    ) -> RolloutState:
        """Wait until every serve pod's keeper serves the new drafter (or has switched). A refusal
        by the server (the files do not fit the running drafter), or keepers the API server
        cannot reach, replace the pods with `fallback` (the new render; for a switch, the plain
        non-speculative one): the revision becomes a rollout, and its record says both."""
        outcome = swap.follow(
            self.session,
            plan,
            swap.Following(
                self.wait.timeout_s, self.wait.poll_s, self.reporter.status, self.lock.renew
            ),
        )
        if plan.record_key == "swap":
            record.details["swap"] = outcome.details()
        else:
            record.details["switch"] = outcome.switch_details(plan)
        if not outcome.refused:
            self.session.record(record, new=False)
            return outcome.state
        unreachable = outcome.state.failure == "KeepersUnreachable"
        change = "swap" if plan.record_key == "swap" else "speculation switch"
        said = (
            f"the {change} could not be followed"
            if unreachable
            else f"the server refused the {change}"
        )
        self.reporter.info(f"{said} ({outcome.refused}); replacing the pods instead")
        record.manifests = fallback.manifests
        how = "not followed (keepers unreachable)" if unreachable else "refused"
        note = f"{plan.record_key} {how}: rolled out"
        record.note = "; ".join(filter(None, [fallback.note, note]))
        self.session.record(record, new=False)
        self.lock.renew()
        for obj in fallback.manifests:
            self.session.apply([obj], force=self.change.force)
        written = [ref(o) for o in fallback.manifests]
        for pruned in self.session.prune(fallback.release, keep=written):
            self.reporter.info(f"pruned {pruned}")
        return self._wait(fallback) or outcome.state

    def _wait(self, revision: Revision) -> RolloutState | None:
        if not self.wait.wait:
            return None
        deployments = [o for o in revision.manifests if o["kind"] == "Deployment"]
        wanted = revision.follow or revision.release
        deployment = next(
            (o for o in deployments if o["metadata"]["name"] == wanted), deployments[0]
        )
        watcher = self.session.rollout_watcher(
            deployment["metadata"]["name"],
            startup_budget_s(deployment),
            self.wait.scheduling_grace_s,
        )
        progress = StartupProgress(self.session)
        return follow_rollout(
            watcher, self.wait, self.reporter, self.lock.renew, describe=progress.describe
        )

    def _startup(self, revision: Revision, record: ReleaseRecord) -> dict[str, Any] | None:
        """The new pods' start-up by phase, printed and kept in the record (None: no pod of the
        revision is Ready, or its log says nothing of a vLLM start-up)."""
        followed = revision.follow or revision.release
        deployments = [o for o in revision.manifests if o["kind"] == "Deployment"]
        deployment = next(
            (o for o in deployments if o["metadata"]["name"] == followed),
            deployments[0] if deployments else None,
        )
        table = deployment_startup(self.session, deployment) if deployment else None
        if table is None:
            return None
        self.reporter.info("start-up by phase (vLLM's own log lines):\n" + "\n".join(table.lines()))
        startup = table.to_dict()
        if revision.start_estimate_s and table.total_s:
            off = table.total_s / revision.start_estimate_s - 1
            startup["predicted_s"] = round(revision.start_estimate_s, 1)
            self.reporter.info(
                f"start-up took {table.total_s:.0f} s; predicted {revision.start_estimate_s:.0f} s "
                f"({off:+.0%})"
            )
        record.details["startup"] = startup
        return startup


def _existing(
    session: ClusterSession, revision: Revision
) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(kind, name) of the release's live objects, and of those plus any wanted object that
    already exists (a claim, an object another revision left)."""
    live = {
        (o["kind"], o["metadata"]["name"]) for o in session.live_release_objects(revision.release)
    }
    wanted = {(t.kind, t.name) for t in map(ref, revision.manifests)}
    return live, live | {(kind, name) for kind, name in wanted - live if session.get(kind, name)}


def _new_record(session: ClusterSession, revision: Revision, number: int) -> ReleaseRecord:
    return ReleaseRecord(
        release=revision.release,
        workload=revision.workload,
        revision=number,
        status=RevisionStatus.PENDING.value,
        created_at=_now(),
        user=getpass.getuser(),
        cluster=revision.cluster,
        namespace=session.namespace,
        drafter=revision.drafter,
        image=revision.image,
        config_sha256=revision.config_sha256,
        config_text=revision.config_text,
        overrides=revision.overrides,
        manifests=revision.manifests,
        note=revision.note,
        source_revision=revision.source_revision,
    )


def follow_rollout(
    watcher: Any,
    wait: WaitOptions,
    reporter: Reporter,
    keep_alive: Any,
    describe: Callable[[RolloutState], str] | None = None,
) -> RolloutState:
    """Poll until ready or failed; the lock is renewed as we go (loads take ~25 minutes).
    `describe` words each state (the phase a loading pod's vLLM is in)."""
    start = time.monotonic()
    last_renew = start
    while True:
        state: RolloutState = watcher.poll()
        elapsed = time.monotonic() - start
        line = describe(state) if describe else f"{state.phase}: {state.message}"
        reporter.status(f"[{elapsed:5.0f}s] {line}")
        if state.done:
            return state
        if elapsed > wait.timeout_s:
            return RolloutState(
                "failed",
                f"not ready within --timeout {wait.timeout_s:.0f}s "
                f"(last phase: {state.phase}: {state.message})",
                "Timeout",
                state.pod,
            )
        if time.monotonic() - last_renew > 30:
            keep_alive()
            last_renew = time.monotonic()
        time.sleep(wait.poll_s)


def startup_budget_s(deployment: dict[str, Any]) -> float:
    """The startup probe's budget, read from the manifest being rolled out."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    probe = container.get("startupProbe") or {}
    return float(probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3))


def _mark_serving(
    session: ClusterSession,
    history: list[ReleaseRecord],
    record: ReleaseRecord,
    replaced_as: RevisionStatus,
) -> None:
    for previous in lifecycle.deployed(history):  # one, unless a record was changed by hand
        lifecycle.change_status(previous, replaced_as)
        session.record(previous, new=False)
    lifecycle.change_status(record, RevisionStatus.DEPLOYED)
    session.record(record, new=False)


def revision_from_record(record: ReleaseRecord, note: str) -> Revision:
    return Revision(
        release=record.release,
        workload=record.workload,
        manifests=record.manifests,
        drafter=record.drafter,
        image=record.image,
        cluster=record.cluster,
        config_sha256=record.config_sha256,
        config_text=record.config_text,
        overrides=record.overrides,
        note=note,
        source_revision=record.revision,
        follow=next(
            (
                o["metadata"]["name"]
                for o in record.manifests
                if o["kind"] == "Deployment" and o["metadata"]["name"].endswith(CANARY_SUFFIX)
            ),
            None,
        ),
    )


@dataclass(frozen=True)
class RollbackTo:
    """Where a rollback goes: revision `to`, else (`no_spec`) the serving revision re-rendered with
    drafter none, else the previous good one. `expect_serving` (the gate, a calibration) refuses
    when another revision serves by then; `note` replaces the record's default note."""

    to: int | None = None
    no_spec: bool = False
    note: str | None = None
    expect_serving: int | None = None


def rollback(
    session: ClusterSession,
    release: str,
    target: RollbackTo,
    options: ApplyOptions,
    reporter: Reporter,
) -> Outcome:
    """Roll the release back to `target`. The history is read under the lock, so the revision is
    chosen from what is true when the rollback applies."""
    to, no_spec, note, expect_serving = (
        target.to,
        target.no_spec,
        target.note,
        target.expect_serving,
    )
    with session.lock(release, "rollback") as lock:
        history = session.history(release)
        if not history:
            raise UsageError(
                f"{release} has no history in namespace {session.namespace}",
                hint="`kimideploy up serve` creates the first revision",
            )
        current = lifecycle.current(history)
        serving = lifecycle.serving(history)
        if expect_serving is not None and (serving is None or serving.revision != expect_serving):
            now = f"revision {serving.revision}" if serving is not None else "nothing"
            raise StaleRollbackError(
                f"revision {expect_serving} is no longer serving ({now} is), so nothing was "
                "rolled back",
                hint="someone else changed the release meanwhile; see `kimideploy history serve`",
            )
        if no_spec:
            revision = non_speculative_revision(current)
        else:
            _refuse_untrusted(session, release, to)
            chosen = lifecycle.rollback_target(history, to)
            revision = revision_from_record(chosen, f"rollback to revision {chosen.revision}")
        if note:
            revision = replace(revision, note=note)
        return _Transaction(session, lock, options, reporter, "rollback").apply(revision)


def switched_off_form(
    revision: Revision, applied: ReleaseRecord | None, swap_allowed: bool
) -> Revision:
    """A non-speculative revision in its switched-off form, where the pods last applied can
    switch and the two differ in nothing but speculation (else the revision as it is)."""
    loaded = swap.loaded_drafter(applied.manifests if applied else None)
    if revision.switch_off is None or loaded is None or not swap_allowed:
        return revision
    switched = revision.switch_off(loaded)
    assert applied is not None
    # No plan and no reason: speculation is off already, and re-applying that is no change.
    if swap.decide(applied.manifests, switched.manifests).why_not:
        return revision
    return switched


@dataclass(frozen=True)
class Preview:
    """What a change would do, decided as the change decides it, with nothing written."""

    revision: int
    drafter: str
    how: str
    diff: str

    def lines(self) -> list[str]:
        return [f"revision {self.revision} would serve {self.drafter}: {self.how}", self.diff]


def rollback_preview(
    session: ClusterSession, release: str, target: RollbackTo, change: ChangeOptions
) -> Preview:
    """`rollback --dry-run`: the revision the rollback would choose now, how it would reach the
    pods (a switch or a swap in seconds, or a rollout), and the API server's dry-run diff."""
    history = session.history(release)
    if not history:
        raise UsageError(
            f"{release} has no history in namespace {session.namespace}",
            hint="`kimideploy up serve` creates the first revision",
        )
    if target.no_spec:
        revision = non_speculative_revision(lifecycle.current(history))
    else:
        _refuse_untrusted(session, release, target.to)
        chosen = lifecycle.rollback_target(history, target.to)
        revision = revision_from_record(chosen, f"rollback to revision {chosen.revision}")
    applied = lifecycle.last_applied(history)
    require_prerequisites(session, revision.manifests, revision.cluster)
    revision = switched_off_form(revision, applied, change.swap)
    decision = swap.decide(applied.manifests if applied else None, revision.manifests, change.swap)
    manifests = decision.plan.manifests if decision.plan is not None else revision.manifests
    if decision.plan is not None:
        how = f"{decision.plan.what} (seconds; the pods stay)"
    else:
        why = f" ({decision.why_not})" if decision.why_not else ""
        how = f"a rollout: the pods are replaced and the target loads again{why}"
    diff = session.dry_run_diff(manifests, force=change.force) or "no changes"
    return Preview(lifecycle.next_revision(history), revision.drafter, how, diff)


def down_preview(session: ClusterSession, release: str) -> list[ObjectRef]:
    """`down --dry-run`: what `down` would remove now (claims and history stay)."""
    if not session.namespace_exists():
        return []
    live = session.live_release_objects(release)
    return [ObjectRef(o["kind"], session.namespace, o["metadata"]["name"]) for o in live]


def _refuse_untrusted(session: ClusterSession, release: str, to: int | None) -> None:
    """`--to N` of a record that failed the trust checks: say so (it is never applied)."""
    name = secret_name(release, to) if to is not None else None
    for refused in session.ignored_records.get(release, []):
        if name is not None and refused.message.startswith(f"{name}:"):
            raise UntrustedRecordError(
                f"--to {to}: {refused.message}; refusing to apply it", hint=refused.hint
            )


class StaleRollbackError(KimiDeployError):
    """The revision a rollback was meant to replace is no longer the serving one."""


def non_speculative_revision(current: ReleaseRecord) -> Revision:
    """Re-render the current revision's stored config and overrides with drafter `none`."""
    if not current.config_text:
        raise UsageError(f"revision {current.revision} has no stored config to re-render")
    loaded = load_project_text(current.config_text, Path(f"revision-{current.revision}.yaml"))
    request = PlanRequest(current.workload, current.cluster, NO_DRAFTER, tuple(current.overrides))
    # What the cluster answered when this revision was made, as the revision recorded it.
    answered = ClusterAnswers(
        namespace=current.namespace,
        monitoring_crd=any(o["kind"] == "PodMonitor" for o in current.manifests),
    )
    rendered = render_workload(loaded, request, answered)
    revision = revision_from_render(loaded, rendered, "rollback to non-speculative serving")
    form = switch_off_form(loaded, request, answered)
    assert form is not None

    def switched_off(drafter: str) -> Revision:
        switched = form(drafter)
        note = f"rollback to non-speculative serving: {switched.note}"
        return replace(
            switched,
            config_text=current.config_text,
            source_revision=current.revision,
            note=note,
        )

    return replace(
        revision,
        config_text=current.config_text,
        source_revision=current.revision,
        switch_off=switched_off,
    )


def down(
    session: ClusterSession, release: str, change: ChangeOptions, reporter: Reporter
) -> list[ObjectRef]:
    """Remove the release's objects; PersistentVolumeClaims and history stay."""
    if not session.namespace_exists():  # nothing can be there (and the lock could not be taken)
        reporter.info(f"{release}: namespace {session.namespace} does not exist; nothing to remove")
        return []
    with session.lock(release, "down") as lock:
        live = session.live_release_objects(release)
        targets = [ObjectRef(o["kind"], session.namespace, o["metadata"]["name"]) for o in live]
        if not targets:
            reporter.info(f"{release}: nothing to remove in namespace {session.namespace}")
            return []
        reporter.info(
            "\n".join([f"remove from namespace {session.namespace}:"] + [f"  {t}" for t in targets])
        )
        if not (change.yes or reporter.confirm(f"remove {release}?")):
            raise KimiDeployError(
                "cancelled; nothing was removed",
                hint="pass --yes to skip the question",
                outcome={"status": "cancelled", "release": release},
            )
        lock.renew()  # a Lease that expired during the question may now be another run's
        for target in reversed(targets):
            session.delete(target)
        # Foreground deletion: the Deployment goes once its pods have; only then are GPUs free.
        reporter.status("waiting for the objects and their pods to be deleted")
        left = session.wait_gone(targets)
        if left:
            reporter.info(f"still terminating after 5 minutes: {', '.join(left)}")
        serving = lifecycle.serving(session.history(release))
        if serving is not None:
            note = (serving.note + "; removed by down").lstrip("; ")
            lifecycle.change_status(serving, RevisionStatus.REMOVED, note=note)
            session.record(serving, new=False)
        claims = session.list_claims()
        if claims:
            reporter.info(f"kept PersistentVolumeClaims: {', '.join(claims)}")
        return targets
