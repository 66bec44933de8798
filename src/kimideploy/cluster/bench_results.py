"""Bench results kept in the cluster: one ConfigMap per measured run, found by label.

The gate compares a drafter's run with the newest comparable non-speculative run, so results must
outlive the bench pod and the machine that ran the CLI; a ConfigMap in the release's namespace is
visible to everyone with the same kubeconfig (the numbers are not sensitive).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from kimideploy.cluster.api import KubeApi, NotFoundError
from kimideploy.cluster.resources import path
from kimideploy.formats.bench_result import BenchResult

RESULT_LABEL = "kimideploy.io/bench-result"
DEFAULT_KEEP = 50


@dataclass(frozen=True, kw_only=True)
class MeasuredOn:
    """What a bench result is labelled with: the revision it measured and the settings that make
    two results comparable (the gate's terms, or what was serving for a manual `run bench`)."""

    release: str
    drafter: str
    cluster: str
    image: str
    revision: int
    serve_fingerprint: str
    bench_fingerprint: str


@dataclass(frozen=True, kw_only=True)
class StoredBench(MeasuredOn):
    """One bench run: where it ran, what it measured, and the result event of the bench pod."""

    run_id: str
    measured_at: str
    result: BenchResult


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


FUTURE_SKEW = timedelta(minutes=5)
"""How far past the API server's clock a stored time may be before it is not believed."""


def read_results(api: KubeApi, namespace: str, release: str) -> tuple[list[StoredBench], list[str]]:
    """Every stored run of the release that is well formed and not dated in the future (by the
    API server's clock), oldest first; and why the others were not believed. A ConfigMap in the
    namespace is written by anyone who may write ConfigMaps there: a result dated 2099 would
    otherwise be the 'newest' baseline forever."""
    listed = api.request(
        "GET", path("ConfigMap", namespace), {"labelSelector": f"{RESULT_LABEL}={release}"}
    )
    now = api.server_time()
    found, refused = [], []
    for item in listed.get("items", []):
        name = str(((item.get("metadata") or {}).get("name")) or "a bench result")
        try:
            bench = _read(item, release)
            if measured_time(bench.measured_at) > now + FUTURE_SKEW:
                raise ValueError(f"measured_at {bench.measured_at} is in the future")
        except (KeyError, ValueError, TypeError) as exc:
            refused.append(f"{name}: {exc}")
            continue
        found.append(bench)
    found.sort(key=lambda b: (measured_time(b.measured_at), b.run_id))
    return found, refused


def list_results(api: KubeApi, namespace: str, release: str) -> list[StoredBench]:
    return read_results(api, namespace, release)[0]


def measured_time(stamp: str) -> datetime:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S%z")


def _read(item: dict[str, Any], release: str) -> StoredBench:
    data = json.loads(str((item.get("data") or {})["bench.json"]))
    if not isinstance(data, dict):
        raise TypeError("bench.json is not an object")
    for name, kind in STORED_TYPES.items():
        value = data.get(name)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise TypeError(f"{name} is {type(value).__name__}, not {kind.__name__}")
    if data["release"] != release:
        raise ValueError(f"it is a result of release {data['release']!r}")
    measured_time(data["measured_at"])  # raises ValueError when it does not parse
    values = {name: data[name] for name in STORED_TYPES}
    return StoredBench(**{**values, "result": BenchResult.from_dict(data["result"])})


STORED_TYPES: dict[str, type] = {
    "release": str,
    "run_id": str,
    "drafter": str,
    "cluster": str,
    "image": str,
    "revision": int,
    "serve_fingerprint": str,
    "bench_fingerprint": str,
    "measured_at": str,
    "result": dict,
}


def _as_dict(bench: StoredBench) -> dict[str, Any]:
    values = {name: getattr(bench, name) for name in bench.__dataclass_fields__}
    return {**values, "result": bench.result.as_dict()}
