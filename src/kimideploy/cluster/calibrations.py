"""Calibrations kept in the cluster: one ConfigMap per `run calibrate`, found by label.

Like bench results (bench_results.py): they must outlive the pods and the machine that ran the
CLI, and everyone with the same kubeconfig predicts with the same curve. A partial calibration
(interrupted, or a k that failed) is stored too, after every k, and `run calibrate` resumes it.
"""

from __future__ import annotations

import contextlib
import json
from datetime import datetime

from kimideploy.cluster.api import KubeApi, NotFoundError
from kimideploy.cluster.bench_results import FUTURE_SKEW
from kimideploy.cluster.kept_config_maps import put_config_map
from kimideploy.cluster.resources import path
from kimideploy.plan.calibration import Calibration

CALIBRATION_LABEL = "kimideploy.io/calibration"
DATA_KEY = "calibration.json"
DEFAULT_KEEP = 20


def config_map_name(cluster: str, calibration_id: str) -> str:
    return f"kimideploy.calibration.{cluster}.{calibration_id}"


def store(api: KubeApi, namespace: str, calibration_id: str, calibration: Calibration) -> None:
    """Create or replace the calibration's ConfigMap (it is rewritten after every k)."""
    labels = {
        CALIBRATION_LABEL: calibration.cluster,
        "kimideploy.io/calibration-id": calibration_id,
        "kimideploy.io/complete": str(calibration.complete).lower(),
    }
    put_config_map(api, namespace, config_map_name(calibration.cluster, calibration_id), labels,
                   {DATA_KEY: json.dumps(calibration.to_dict(), sort_keys=True)})  # fmt: skip
    for old_id, _ in list_calibrations(api, namespace, calibration.cluster)[:-DEFAULT_KEEP]:
        with contextlib.suppress(NotFoundError):
            api.request(
                "DELETE", path("ConfigMap", namespace, config_map_name(calibration.cluster, old_id))
            )


def list_calibrations(api: KubeApi, namespace: str, cluster: str) -> list[tuple[str, Calibration]]:
    """(id, calibration) of the cluster profile, oldest first; unreadable ones are skipped."""
    listed = api.request(
        "GET", path("ConfigMap", namespace), {"labelSelector": f"{CALIBRATION_LABEL}={cluster}"}
    )
    latest = api.server_time() + FUTURE_SKEW
    found = []
    for item in listed.get("items", []):
        with contextlib.suppress(KeyError, ValueError, TypeError):
            calibration = Calibration.from_dict(json.loads(item["data"][DATA_KEY]))
            measured = datetime.fromisoformat(calibration.measured_at.replace("Z", "+00:00"))
            if measured.tzinfo is None or measured > latest:
                continue  # a date in the future would make it the newest forever
            found.append((item["metadata"]["labels"]["kimideploy.io/calibration-id"], calibration))
    return sorted(found, key=lambda pair: (pair[1].measured_at, pair[0]))
