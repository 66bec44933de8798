"""An engine pod's start-up by phase, read through the cluster: the pod's log with the kubelet's
timestamps, its container's start and its Ready time, parsed by formats/startup_phases.py. `up`,
`rollback` and `run` print the table when an engine has started and keep it (the release record,
the run's outcome); while a pod loads, the rollout's status line names the phase it is in."""

from __future__ import annotations

import time
from typing import Any

from kimideploy.cluster.jobs import INDEX_LABEL
from kimideploy.cluster.pods import container_times, is_ready
from kimideploy.cluster.rollout import RolloutState
from kimideploy.cluster.session import ClusterSession
from kimideploy.formats.startup_phases import StartupPhases, in_progress, parse
from kimideploy.plan.model import EngineStart

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"

START_UP_LOG_LINES = 20_000
"""How much of the log a finished start-up is read from: a Kimi-K2.5 start on 8 ranks prints a
few hundred lines; a pod read long after it started may have served since."""
PROGRESS_LOG_LINES = 400
PROGRESS_PERIOD_S = 15.0
"""How often a loading pod's log is read for the status line (a load takes minutes)."""


def pod_startup(
    session: ClusterSession, pod: dict[str, Any], container: str | None = None
) -> StartupPhases:
    """The start-up table of `pod`'s container (default: its first)."""
    name = pod["metadata"]["name"]
    text = session.log(name, tail=START_UP_LOG_LINES, container=container, timestamps=True)
    started, ready = container_times(pod, container)
    return parse(text.splitlines(), started_at=started, ready_at=ready)


def deployment_startup(session: ClusterSession, deployment: dict[str, Any]) -> StartupPhases | None:
    """The table of the newest Ready pod of `deployment` (None: none is Ready, or its log says
    nothing of a vLLM start-up)."""
    match = deployment["spec"]["selector"].get("matchLabels") or {}
    selector = ",".join(f"{k}={v}" for k, v in sorted(match.items()))
    ready = [p for p in session.pods(selector) if is_ready(p)]
    if not ready:
        return None
    table = pod_startup(session, ready[-1])
    return table if table.phases else None


def _first_index_pod(session: ClusterSession, job: str) -> dict[str, Any] | None:
    pods = session.pods(f"{JOB_NAME_LABEL}={job}")
    first = [p for p in pods if p["metadata"].get("labels", {}).get(INDEX_LABEL, "0") == "0"]
    return first[-1] if first else None


def engine_phase(session: ClusterSession, job: str, engine: EngineStart) -> str | None:
    """The phase a run's engine is in now (None: its pod has logged nothing yet)."""
    pod = _first_index_pod(session, job)
    if pod is None or not pod.get("spec", {}).get("nodeName"):
        return None
    name = pod["metadata"]["name"]
    text = session.log(name, tail=PROGRESS_LOG_LINES, container=engine.container)
    return in_progress(text.splitlines()) if text else None


def run_startup(session: ClusterSession, job: str, engine: EngineStart) -> StartupPhases | None:
    """The table of a run's engine: index 0's newest pod (every index starts the same engine)."""
    pod = _first_index_pod(session, job)
    if pod is None:
        return None
    table = pod_startup(session, pod, engine.container)
    return table if table.phases else None


class StartupProgress:
    """The rollout's status line, with the phase a loading pod's vLLM is in (its log read at
    most every PROGRESS_PERIOD_S)."""

    def __init__(self, session: ClusterSession, period_s: float = PROGRESS_PERIOD_S) -> None:
        self.session = session
        self.period_s = period_s
        self.read_at = 0.0
        self.phase: str | None = None

    def describe(self, state: RolloutState) -> str:
        line = f"{state.phase}: {state.message}"
        if state.phase != "loading weights" or not state.pod:
            return line
        if time.monotonic() - self.read_at >= self.period_s:
            self.read_at = time.monotonic()
            text = self.session.log(state.pod, tail=PROGRESS_LOG_LINES)
            self.phase = in_progress(text.splitlines()) if text else self.phase
        return f"{line}; vLLM: {self.phase}" if self.phase else line
