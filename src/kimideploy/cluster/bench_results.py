"""Bench results kept in the cluster: one ConfigMap per measured run, found by label.

The gate compares a drafter's run with the newest comparable non-speculative run, so results must
outlive the bench pod and the machine that ran the CLI; a ConfigMap in the release's namespace is
visible to everyone with the same kubeconfig (the numbers are not sensitive).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

from kimideploy.cluster.api import KubeApi, NotFoundError
from kimideploy.cluster.resources import path

RESULT_LABEL = "kimideploy.io/bench-result"
DEFAULT_KEEP = 50


@dataclass(frozen=True)
class StoredBench:
    """One bench run: where it ran, what it measured, and the result event of the bench pod."""

    release: str
    run_id: str
    drafter: str
    cluster: str
    image: str
    revision: int
    serve_fingerprint: str
    bench_fingerprint: str
    measured_at: str
    result: dict[str, Any]


def config_map_name(release: str, run_id: str) -> str:
    return f"kimideploy.bench.{release}.{run_id}"


def store(api: KubeApi, namespace: str, bench: StoredBench, keep: int = DEFAULT_KEEP) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": config_map_name(bench.release, bench.run_id),
            "namespace": namespace,
            "labels": {
                RESULT_LABEL: bench.release,
                "kimideploy.io/run-id": bench.run_id,
                "kimideploy.io/drafter": bench.drafter,
                "kimideploy.io/cluster": bench.cluster,
                "app.kubernetes.io/managed-by": "kimideploy",
            },
        },
        "data": {"bench.json": json.dumps(_as_dict(bench), sort_keys=True)},
    }
    api.request("POST", path("ConfigMap", namespace), body=body)
    for old in list_results(api, namespace, bench.release)[:-keep]:
        with contextlib.suppress(NotFoundError):
            api.request(
                "DELETE", path("ConfigMap", namespace, config_map_name(old.release, old.run_id))
            )


def list_results(api: KubeApi, namespace: str, release: str) -> list[StoredBench]:
    """Every stored run of the release, oldest first."""
    listed = api.request(
        "GET", path("ConfigMap", namespace), {"labelSelector": f"{RESULT_LABEL}={release}"}
    )
    found = []
    for item in listed.get("items", []):
        with contextlib.suppress(KeyError, ValueError, TypeError):
            found.append(StoredBench(**json.loads(item["data"]["bench.json"])))
    return sorted(found, key=lambda b: (b.measured_at, b.run_id))


def _as_dict(bench: StoredBench) -> dict[str, Any]:
    return {name: getattr(bench, name) for name in bench.__dataclass_fields__}
