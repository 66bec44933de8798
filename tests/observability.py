"""A real Prometheus server (and kube-state-metrics) for the tests that check kimideploy's PromQL.

Both are built from their Go modules by scripts/build-prometheus and cached under
~/.cache/kimideploy/observability/. A PodMonitor is turned into the scrape job the Prometheus
Operator generates for it (pod discovery, the selector and port kept, podTargetLabels copied,
namespace/pod/container/job/endpoint labels), so a test scrapes what a cluster's Prometheus would.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO
from tests.go_builds import wait_for_go_builds
from tests.ports import free_port

BUILD = REPO / "scripts" / "build-prometheus"


class UnavailableError(Exception):
    """The binaries could not be built (the message says why)."""


def binaries() -> tuple[Path, Path]:
    """(prometheus, kube-state-metrics), building them on first use."""
    wait_for_go_builds()
    build = subprocess.run([str(BUILD)], capture_output=True, text=True)
    if build.returncode != 0:
        raise UnavailableError(f"scripts/build-prometheus failed: {build.stderr.strip()[-2000:]}")
    prometheus, ksm = (Path(line) for line in build.stdout.split())
    return prometheus, ksm


def label_name(name: str) -> str:
    """A Kubernetes label key as a Prometheus label name (what discovery and the Operator do)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def pod_monitor_job(monitor: dict[str, Any], kubeconfig: Path) -> list[dict[str, Any]]:
    """The scrape jobs the Prometheus Operator generates for `monitor`, discovering pods through
    the API server in `kubeconfig`."""
    meta, spec = monitor["metadata"], monitor["spec"]
    namespace, name = meta["namespace"], meta["name"]
    keep_selector = [
        {
            "action": "keep",
            "source_labels": [
                f"__meta_kubernetes_pod_label_{label_name(key)}",
                f"__meta_kubernetes_pod_labelpresent_{label_name(key)}",
            ],
            "regex": f"({re.escape(value)});true",
        }
        for key, value in spec["selector"]["matchLabels"].items()
    ]
    target_labels = [
        {
            "source_labels": [f"__meta_kubernetes_pod_label_{label_name(key)}"],
            "target_label": label_name(key),
            "regex": "(.+)",
            "replacement": "${1}",
        }
        for key in spec.get("podTargetLabels", [])
    ]
    jobs = []
    for index, endpoint in enumerate(spec["podMetricsEndpoints"]):
        interval = endpoint.get("interval", "30s")
        relabel = [
            *keep_selector,
            {
                "action": "keep",
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": endpoint["port"],
            },
            {
                "action": "drop",
                "source_labels": ["__meta_kubernetes_pod_phase"],
                "regex": "(Failed|Succeeded)",
            },
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {
                "source_labels": ["__meta_kubernetes_pod_container_name"],
                "target_label": "container",
            },
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            *target_labels,
            {"target_label": "job", "replacement": f"{namespace}/{name}"},
            {"target_label": "endpoint", "replacement": endpoint["port"]},
        ]
        jobs.append(
            {
                "job_name": f"podMonitor/{namespace}/{name}/{index}",
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "metrics_path": endpoint.get("path", "/metrics"),
                "kubernetes_sd_configs": [
                    {
                        "role": "pod",
                        "kubeconfig_file": str(kubeconfig),
                        "namespaces": {"names": [namespace]},
                    }
                ],
                "relabel_configs": relabel,
            }
        )
    return jobs


class QueryError(AssertionError):
    pass


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def _get(self, path: str, **params: str | list[str]) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=30) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:  # a bad expression answers 400 with the reason
            body = json.loads(exc.read())
        if body.get("status") != "success":
            raise QueryError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's series: [{"metric": labels, "value": float}]."""
        data = self._get("/api/v1/query", query=expr)
        if data["resultType"] != "vector":
            raise QueryError(f"{expr}: a {data['resultType']}, not an instant vector")
        return [{"metric": r["metric"], "value": float(r["value"][1])} for r in data["result"]]

    def label_values(self, label: str, match: str) -> list[str]:
        values: list[str] = self._get(f"/api/v1/label/{label}/values", **{"match[]": [match]})
        return values

    def targets(self) -> list[dict[str, Any]]:
        """Active targets: labels, health and the last scrape error (for failure messages)."""
        active: list[dict[str, Any]] = self._get("/api/v1/targets")["activeTargets"]
        return [
            {"labels": t["labels"], "health": t["health"], "error": t.get("lastError", "")}
            for t in active
        ]

    def wait_for(self, expr: str, timeout: float) -> list[dict[str, Any]]:
        """The first non-empty answer to `expr` within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            series = self.query(expr)
            if series and all(math.isfinite(s["value"]) for s in series):
                return series
            if time.monotonic() > deadline:
                raise QueryError(
                    f"{expr} returned {series} after {timeout:.0f} s; targets: {self.targets()}"
                )
            time.sleep(1)


@contextmanager
def serving(
    command: list[str], ready_url: str, log: Path, timeout: float = 180
) -> Iterator[subprocess.Popen[bytes]]:
    """`command` running until `ready_url` answers (or failing with its log), stopped on exit.

    The timeout is generous because these servers start beside CPU vLLM engines and the control
    plane on two cores: a Prometheus that starts in a second alone once took over 60 s there (CI,
    stop 35, with an empty warn-level log, so the log is now kept at info level)."""
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    try:
        started = time.monotonic()
        while True:
            try:
                with urllib.request.urlopen(ready_url, timeout=5):
                    break
            except OSError as error:
                exited = process.poll()
                if exited is not None or time.monotonic() - started > timeout:
                    name = Path(command[0]).name
                    state = f"exited with {exited}" if exited is not None else "still running"
                    raise QueryError(
                        f"{name} did not answer {ready_url} within {time.monotonic() - started:.0f} s"
                        f" ({state}; last answer: {error}); its log:\n{log.read_text()[-3000:]}"
                    ) from None
                time.sleep(0.3)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


@contextmanager
def prometheus(binary: Path, root: Path, scrape_jobs: list[dict[str, Any]]) -> Iterator[Prometheus]:
    """A Prometheus server on 127.0.0.1 with these scrape jobs, stopped on exit."""
    root.mkdir(parents=True, exist_ok=True)
    config = root / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"evaluation_interval": "5s"},
                                      "scrape_configs": scrape_jobs}))  # fmt: skip
    url, log = f"http://127.0.0.1:{free_port()}", root / "prometheus.log"
    command = [str(binary), f"--config.file={config}", f"--storage.tsdb.path={root / 'data'}",
               f"--web.listen-address={url.removeprefix('http://')}", "--log.level=info"]  # fmt: skip
    with serving(command, url + "/-/ready", log) as process:
        yield Prometheus(url, process, log)


@contextmanager
def kube_state_metrics(binary: Path, kubeconfig: Path, namespace: str, allowlist: str,
                       log: Path) -> Iterator[str]:  # fmt: skip
    """kube-state-metrics watching the Secrets of one namespace; yields its host:port."""
    port, telemetry = free_port(), free_port()
    command = [str(binary), f"--kubeconfig={kubeconfig}", "--resources=secrets",
               f"--namespaces={namespace}", f"--metric-labels-allowlist={allowlist}",
               "--host=127.0.0.1", f"--port={port}", "--telemetry-host=127.0.0.1",
               f"--telemetry-port={telemetry}"]  # fmt: skip
    with serving(command, f"http://127.0.0.1:{port}/metrics", log):
        yield f"127.0.0.1:{port}"


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    expr: str
    legend_labels: tuple[str, ...]
    """The labels the panel's legend names ({{position}}); every series must carry them."""


def panel_queries(dashboard: dict[str, Any], variables: dict[str, str]) -> list[PanelQuery]:
    """Every panel target's expression with Grafana's variables replaced by `variables`."""
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name in sorted(variables, key=len, reverse=True):  # $__rate_interval before $r
                expr = expr.replace(f"${name}", variables[name])
            unresolved = re.findall(r"\$\{?\w+", expr)
            if unresolved:
                raise QueryError(f"panel {panel['title']!r}: {unresolved} not substituted")
            legend = tuple(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat") or ""))
            queries.append(PanelQuery(panel["title"], expr, legend))
    return queries


def variable_queries(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(variable, metric, label) of every `label_values(metric, label)` template variable."""
    found = []
    for variable in dashboard["templating"]["list"]:
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable.get("query", ""))
        if variable.get("type") == "query" and match:
            found.append((variable["name"], match.group(1).strip(), match.group(2)))
    return found


def answers(server: Prometheus, queries: list[PanelQuery], timeout: float) -> dict[str, Any]:
    """Each query's series once it has any; fails naming the query whose answer is empty, not a
    finite number, or missing a label its legend shows."""
    found: dict[str, Any] = {}
    for query in queries:
        series = server.wait_for(query.expr, timeout)
        for one in series:
            missing = [label for label in query.legend_labels if label not in one["metric"]]
            if missing:
                raise QueryError(f"{query.panel}: {query.expr} series {one} lacks {missing}")
        found[query.expr] = series
    return found
