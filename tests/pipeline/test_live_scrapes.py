"""`status` and `watch serve --act` reading a real vLLM's /metrics through the real API server's pod
proxy, and a real rollback when acceptance is below break-even; a real Prometheus scrapes the same
vLLM through the PodMonitor `up` applied and answers every dashboard panel's query.

The API server proxies a pod by dialing its `status.podIP`. KWOK's simulated pods get addresses no
process listens on, so the proxy answered "resolve_deny: denied destination" for every scrape. Here
vLLM (serving the untrained drafter with the rendered `--speculative-config`) runs inside a network
namespace the test creates, on a veth address of its own (10.213.N.2, nothing outside this
machine), and the simulated serve pod's status is given that address once KWOK has made it Running
(KWOK's pod-ready stage only acts on Pending pods, so it stays). Loopback and link-local addresses
cannot stand in: the API server refuses to proxy to them.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from tests import observability
from tests.integration.conftest import harness, wait_for
from tests.pipeline import pods
from tests.pipeline.conftest import Volumes, kd

SCRAPE_INTERVAL_S = 5
"""The PodMonitor's interval (the least it allows), so that rate() has samples within seconds."""


def greedy_traffic(url: str, stop: threading.Event, api_key: str) -> None:
    """Requests in the target's prompt shape until stopped (bounded: at most 400)."""
    body = json.dumps(
        {
            "model": "tiny-kimi",
            "max_tokens": 48,
            "temperature": 0.0,
            "messages": [
                {
                    "role": "user",
                    "content": "Write the function `dumps` of `json`.",
                }
            ],
        }
    )
    for _ in range(400):
        if stop.is_set():
            return
        request = urllib.request.Request(url + "/v1/chat/completions", data=body.encode(),
                                         headers={"Content-Type": "application/json",
                                                  "Authorization": f"Bearer {api_key}"})  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                response.read()
        except OSError:
            time.sleep(0.5)


def test_watch_reads_real_counters_through_the_pod_proxy_and_rolls_back(
    netns: tuple[str, str],
    pipeline_cluster: harness.TestCluster,
    cpu_python: Path,
    project: Any,
    volumes: Volumes,
    untrained_drafter: dict[str, Any],
    observability_binaries: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    namespace = f"live-{secrets.token_hex(3)}"
    pipeline_cluster.kubectl("create", "namespace", namespace)
    wait_for(lambda: pipeline_cluster.kubectl("-n", namespace, "get", "sa", "default",
                                              check=False), "default SA")  # fmt: skip
    for (secret, field), value in pods.SECRETS.items():  # the Secret `up` checks for
        pipeline_cluster.kubectl("-n", namespace, "create", "secret", "generic", secret,
                                 f"--from-literal={field}={value}")  # fmt: skip
    name, address = netns
    rendered = pods.rendered(project, "serve", "untrained")
    assert rendered.vllm_model is not None
    port = project.project.clusters["cpu"].workloads.serve.port
    args = pods.localize(pods.cpu_vllm_args(rendered.vllm_args, address, port), volumes.roots)
    server = pods.start_vllm(cpu_python, str(volumes.local(rendered.vllm_model)), args,
                             volumes.root / "serve-live.log", netns=name,
                             env=rendered.secret_env, ready_path=rendered.ready_path,
                             mounts=volumes.mounts(rendered, "serve-live"))  # fmt: skip
    stop = threading.Event()
    key = rendered.secret_env["VLLM_API_KEY"]
    traffic = threading.Thread(target=greedy_traffic, args=(server.url, stop, key), daemon=True)
    try:
        assert kd(pipeline_cluster, namespace, "up", "serve", "--drafter", "untrained", "--yes",
                  "--poll", "0.3", "--scheduling-grace", "5", "--set",
                  f"serve.scrape_interval_s={SCRAPE_INTERVAL_S}") == 0  # fmt: skip
        pod = pipeline_cluster.kubectl("-n", namespace, "get", "pods", "-o",
                                       "jsonpath={.items[0].metadata.name}")  # fmt: skip
        pipeline_cluster.kubectl("-n", namespace, "patch", "pod", pod, "--subresource=status",
                                 "--type=merge", "-p", json.dumps({"status": {
                                     "podIP": address, "podIPs": [{"ip": address}]}}))  # fmt: skip
        pods.wait_ready([server])
        traffic.start()
        monitor = json.loads(pipeline_cluster.kubectl("-n", namespace, "get", "podmonitor",
                                                      "tiny-serve", "-o", "json"))  # fmt: skip
        jobs = observability.pod_monitor_job(monitor, pipeline_cluster.kubeconfig)
        with observability.prometheus(observability_binaries[0], volumes.root / "prometheus",
                                      jobs) as prometheus:  # fmt: skip
            dashboard_answers_from_the_scraped_pod(prometheus, pipeline_cluster, namespace)
        capsys.readouterr()
        assert kd(pipeline_cluster, namespace, "status") == 0
        shown = capsys.readouterr().out
        assert "since pod start BELOW break-even" in shown, shown
        code = kd(pipeline_cluster, namespace, "watch", "serve", "--act", "--interval", "8",
                  "--windows", "6")  # fmt: skip
        out, err = capsys.readouterr()
        assert code == 0, err
        assert "rolled back to non-speculative serving: acceptance below the break-even rate" in out
        assert "draft tokens" in out  # judged on the real counters, not on a missing scrape
        assert kd(pipeline_cluster, namespace, "history", "serve", "-o", "json") == 0
        history = json.loads(capsys.readouterr().out)
        latest = max(history, key=lambda r: r["revision"])
        assert latest["drafter"] == "none" and latest["revision"] == 2, history
        deployment = json.loads(pipeline_cluster.kubectl("-n", namespace, "get", "deployment",
                                                         "tiny-serve", "-o", "json"))  # fmt: skip
        # This server was started without the keeper's variables: its keeper route answers but
        # no keeper loop ever looks, so the switch gives way to replacing the pods after
        # swap.KEEPER_SILENT_S (it held the rollback until --timeout before).
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert "--speculative-config" not in container["args"]
    finally:
        stop.set()
        server.stop()
        pipeline_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def dashboard_answers_from_the_scraped_pod(
    prometheus: observability.Prometheus, cluster: harness.TestCluster, namespace: str
) -> None:
    """Every vLLM panel of the dashboard `up` shipped, and its model variable, answered by a real
    Prometheus from the pod the PodMonitor selects, with the labels the panels and podTargetLabels
    promise. (The gate-verdict panel reads kube-state-metrics: tests/integration/test_gate.py.)"""
    config_map = json.loads(cluster.kubectl("-n", namespace, "get", "configmap",
                                            "tiny-serve-dashboard", "-o", "json"))  # fmt: skip
    [dashboard_text] = config_map["data"].values()
    dashboard = json.loads(dashboard_text)
    # Grafana's $__rate_interval is at least four scrape intervals.
    variables = {"model": "tiny-kimi", "__rate_interval": f"{4 * SCRAPE_INTERVAL_S}s"}
    queries = [q for q in observability.panel_queries(dashboard, variables) if "vllm:" in q.expr]
    assert len(queries) >= 9, [q.panel for q in queries]
    found = observability.answers(prometheus, queries, timeout=120)
    [(_, metric, label)] = observability.variable_queries(dashboard)
    assert prometheus.label_values(label, metric) == ["tiny-kimi"]
    [running] = prometheus.query("vllm:num_requests_running")
    labels = running["metric"]
    assert labels["namespace"] == namespace and labels["job"] == f"{namespace}/tiny-serve"
    assert (
        labels["kimideploy_io_drafter"] == "untrained" and labels["kimideploy_io_cluster"] == "cpu"
    )
    for query in queries:
        values = [s["value"] for s in found[query.expr]]
        if query.panel.startswith(("Acceptance rate", "Per-position")):
            assert all(0 <= v <= 1 for v in values), (query.panel, values)
        if query.panel.startswith("Mean acceptance length"):
            assert all(1 <= v <= 4 for v in values), (query.panel, values)  # k = 3
        if query.panel.startswith("Per-position"):
            positions = sorted(s["metric"]["position"] for s in found[query.expr])
            assert positions == ["0", "1", "2"], positions
