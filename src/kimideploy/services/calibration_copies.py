"""Which stored calibration predictions use, and the local copy offline commands read.

The cluster holds the calibrations (cluster/calibrations.py); commands that talk to it read the
newest one with measured levels. `up --dry-run`, `render` and `drafter check` contact no cluster,
so every read or write of a calibration also leaves a copy under
~/.cache/kimideploy/calibrations/<project>/<cluster>.json
(KIMIDEPLOY_CALIBRATION_CACHE moves it), which they use and name as a copy.
Whether a calibration applies to a plan (same image, same serve configuration) is decided by the
resolver either way.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from kimideploy.cluster.session import ClusterSession
from kimideploy.config.loading import LoadedProject
from kimideploy.plan.calibration import Calibration
from kimideploy.plan.model import ClusterAnswers


def cache_file(loaded: LoadedProject, cluster: str) -> Path:
    default = Path.home() / ".cache" / "kimideploy" / "calibrations"
    root = Path(os.environ.get("KIMIDEPLOY_CALIBRATION_CACHE", default))
    return root / loaded.project.name / f"{cluster}.json"


def remember(loaded: LoadedProject, cluster: str, found: tuple[Calibration, ...]) -> None:
    target = cache_file(loaded, cluster)
    with contextlib.suppress(OSError):
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".tmp")
        partial.write_text(json.dumps([c.to_dict() for c in found], sort_keys=True))
        partial.replace(target)


def cached(loaded: LoadedProject, cluster: str) -> tuple[Calibration, ...]:
    """The copy the last cluster read left (oldest first); none when there is no readable copy."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        rows = json.loads(cache_file(loaded, cluster).read_text())
        return tuple(Calibration.from_dict(row) for row in rows)
    return ()


def stored(session: ClusterSession, loaded: LoadedProject, cluster: str) -> tuple[Calibration, ...]:
    """The cluster profile's calibrations that measured anything, oldest first (copied locally)."""
    found = session.calibrations_of(cluster)
    remember(loaded, cluster, found)
    return found


def offline_answers(
    loaded: LoadedProject, cluster: str, namespace: str | None = None
) -> ClusterAnswers:
    """What a command that contacts no cluster takes for its answers: the namespace asked for
    (--namespace), the local copy of its calibrations, PodMonitors unknown."""
    return ClusterAnswers(namespace=namespace, calibrations=cached(loaded, cluster))
