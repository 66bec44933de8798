"""Measurements kept in the cluster, as calibrations are: the storage probe's read bandwidth, a
run's measured rates. One ConfigMap per cluster profile and kind holding the newest entries, so
every user of the same kubeconfig plans with the same figures and the next estimate on the
cluster uses what the last run measured."""

from __future__ import annotations

import json
from typing import Any

from kimideploy.cluster.api import KubeApi, NotFoundError
from kimideploy.cluster.kept_config_maps import put_config_map
from kimideploy.cluster.resources import path

MEASUREMENT_LABEL = "kimideploy.io/measurement"
DATA_KEY = "measurements.json"
KEEP = 60
"""Entries kept per kind: the newest count, the rest are history (rates: every workload's
newest runs share one list)."""


def config_map_name(cluster: str, kind: str) -> str:
    return f"kimideploy.measured.{cluster}.{kind}"


def read(api: KubeApi, namespace: str, cluster: str, kind: str) -> list[dict[str, Any]]:
    """The entries of `kind` on `cluster`, oldest first ([] where none was recorded)."""
    try:
        found = api.request("GET", path("ConfigMap", namespace, config_map_name(cluster, kind)))
    except NotFoundError:
        return []
    try:
        entries = json.loads((found.get("data") or {}).get(DATA_KEY) or "[]")
    except ValueError:
        return []
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def record(
    api: KubeApi, namespace: str, cluster: str, kind: str, entry: dict[str, Any]
) -> list[dict[str, Any]]:
    """Append `entry` (the newest KEEP stay); returns what is kept."""
    kept = [*read(api, namespace, cluster, kind), entry][-KEEP:]
    labels = {MEASUREMENT_LABEL: kind, "kimideploy.io/cluster": cluster}
    put_config_map(api, namespace, config_map_name(cluster, kind), labels,
                   {DATA_KEY: json.dumps(kept, sort_keys=True)})  # fmt: skip
    return kept
