"""A drafter replaced in a running vLLM 0.32 by `kimideploy up`, without restarting it.

The good drafter is served with the rendered arguments (kimideploy's weight-transfer backend, the
development-routes guard, the drafter keeper, vLLM's development mode) inside a network namespace
of its own, as a pod is, and the test control plane's simulated serve pod is given its address,
so the API server's pod proxy reaches it (tests/pipeline/test_live_scrapes.py says why). This
test plays the kubelet's one part that KWOK does not: it copies the spec ConfigMap into the pod's
spec volume when the ConfigMap changes.

`up serve --drafter untrained` is a swap: the Deployment is left as it is, the new spec is
applied, the keeper swaps the drafter in and `up` reads through the pod proxy that it did;
vLLM's count drops to about 1. `rollback serve` swaps the good drafter back and the count
returns. Two more rounds of the bake-off's interleaved A/B (untrained good, good untrained)
tell the two apart in every round. A drafter the registry cannot tell from good but whose files
vLLM would build otherwise is refused by the server, and that `up` becomes a rollout. The process
is the same throughout, started at the same time. A spec naming a drafter
that vLLM cannot take without a restart (layer ids one off: the target captures other layers) is
refused by the server before any weight is written, and the good drafter goes on serving. From
any address but the pod's own, and without the pod's token, the development routes answer 403."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from tests.integration.conftest import harness, wait_for
from tests.pipeline import pods
from tests.pipeline.conftest import Volumes, bench, kd
from tests.pipeline.figures import FIGURES

from kimideploy.config.loading import LoadedProject
from kimideploy.config.specs import SPEC_FILE_NAME
from kimideploy.formats.bench_result import BenchResult
from kimideploy.formats.drafter_swap import (
    DEV_ROUTES_GUARD,
    DRAFTER_FILES_BACKEND,
    DRAFTER_KEEPER,
    KEEPER_PATH,
)
from kimideploy.services.gate import interleave
from kimideploy.workloads.drafter_swap import KEEPER_STATE_FILE_NAME, TOKEN_FILE_NAME, TOKEN_HEADER

CODE_AT_4 = ("code", 4)
SAME_DRAFTER_SPREAD = 0.2
"""How far two benches of one drafter on one server may differ: vLLM's CPU batching reorders
requests under load and flips greedy ties (the same drafter benched twice in one run differed by
up to 0.06 on this tier; 0.2 leaves room for a loaded machine)."""


def _count(result: dict[str, Any]) -> float:
    level = next(lv for lv in result["levels"]
                 if (lv["prompt_set"], lv["concurrency"]) == CODE_AT_4)  # fmt: skip
    value = level["mean_acceptance_length"]
    assert value is not None, level
    return float(value)


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc/PID/stat, field 22)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return fields[19]


def _status(url: str, method: str = "POST", headers: dict[str, str] | None = None) -> int:
    data = b"{}" if method == "POST" else None
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _in_pod(python: Path, netns: str, home: Path, code: str) -> str:
    """Python run as `kubectl exec` runs it: in the pod's network namespace, with its HOME."""
    done = subprocess.run(["ip", "netns", "exec", netns, str(python), "-c", code],
                          capture_output=True, text=True, timeout=120,
                          env=pods.cpu_env(python, HOME=str(home)))  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def _post_from_the_pod(python: Path, netns: str, home: Path, port: int, path: str,
                       token: bool) -> int:  # fmt: skip
    header = (f"{{{TOKEN_HEADER!r}: open({str(home / TOKEN_FILE_NAME)!r}).read().strip()}}"
              if token else "{}")  # fmt: skip
    code = (
        "import urllib.request, urllib.error\n"
        f"r = urllib.request.Request('http://127.0.0.1:{port}{path}', data=b'{{}}', "
        f"headers={header}, method='POST')\n"
        "try:\n    print(urllib.request.urlopen(r, timeout=60).status)\n"
        "except urllib.error.HTTPError as e:\n    print(e.code)\n"
    )
    return int(_in_pod(python, netns, home, code))


def _keeper_state(home: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads((home / KEEPER_STATE_FILE_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return state


def _wait_keeper(home: Path, done: Any, what: str, timeout_s: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = _keeper_state(home)
        if done(state):
            return state
        time.sleep(0.3)
    raise AssertionError(f"the keeper did not {what} within {timeout_s}s: {_keeper_state(home)}")


POD = "serve-swap"


@pytest.fixture(scope="module")
def misfit_drafter(good_drafter: dict[str, Any], volumes: Volumes) -> Path:
    """good's files with another rms_norm_eps: the same spec, a model vLLM would build otherwise."""
    out = volumes.root / "models" / "drafters" / "misfit"
    if not out.exists():
        shutil.copytree(good_drafter["out"], out)
        config = json.loads((out / "config.json").read_text())
        config.setdefault("transformer_layer_config", {})["rms_norm_eps"] = 1e-3
        (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture(scope="module")
def swap_pod(
    netns: tuple[str, str],
    cpu_python: Path,
    project: LoadedProject,
    volumes: Volumes,
    good_drafter: dict[str, Any],
    untrained_drafter: dict[str, Any],
    shifted_drafter: Path,
) -> Iterator[tuple[pods.Rendered, pods.Server, pods.PodMounts, int]]:
    """The rendered serve of the good drafter, in its own network namespace on every address
    (0.0.0.0, as in a pod), on the serve port the control plane's pod proxy will ask for."""
    name, address = netns
    rendered = pods.rendered(project, "serve", "good")
    port = project.project.clusters["cpu"].workloads.serve.port
    started = time.monotonic()
    server, mounts = volumes.start_serving(cpu_python, rendered, POD, host="0.0.0.0",
                                           netns=name, port=port)  # fmt: skip
    server.url = f"http://{address}:{port}"
    try:
        pods.wait_ready([server])
        FIGURES["drafter swap: the reload it replaces, vLLM start-up (s)"] = round(
            time.monotonic() - started, 1
        )
        yield rendered, server, mounts, port
    finally:
        server.stop()


def test_the_rendered_server_can_swap_and_guards_its_development_routes(
    swap_pod: Any, netns: tuple[str, str], cpu_python: Path
) -> None:
    rendered, server, mounts, port = swap_pod
    args = rendered.vllm_args
    assert json.loads(args[args.index("--weight-transfer-config") + 1]) == {
        "backend": DRAFTER_FILES_BACKEND
    }
    middleware = [args[at + 1] for at, arg in enumerate(args) if arg == "--middleware"]
    assert middleware == [DEV_ROUTES_GUARD, DRAFTER_KEEPER]
    assert rendered.vllm_env.get("VLLM_SERVER_DEV_MODE") == "1"
    # From another address (the Service, another pod, the API server): no development route,
    # token or not.
    for path in ("/start_draft_weight_update", "/collective_rpc", "/reset_prefix_cache"):
        assert _status(server.url + path) == 403, path
    assert _status(server.url + "/server_info", "GET") == 403
    # From the pod itself but without the token (a mesh proxy forwarding to loopback).
    assert _post_from_the_pod(cpu_python, netns[0], mounts.home, port,
                              "/start_draft_weight_update", token=False) == 403  # fmt: skip
    # The serving routes and the keeper's read-only answer are not the guard's business.
    assert _status(server.url + "/health", "GET") == 200
    assert _status(server.url + KEEPER_PATH, "GET") == 200


@contextmanager
def kubelet_spec_volume(cluster: harness.TestCluster, namespace: str, config_map: str,
                        volumes: Volumes) -> Iterator[None]:  # fmt: skip
    """The kubelet's part KWOK does not play: the spec ConfigMap copied into the pod's volume
    when it changes (a real kubelet takes up to about a minute; this, half a second)."""
    stop = threading.Event()

    def sync() -> None:
        last = None
        while not stop.is_set():
            found = cluster.kubectl("-n", namespace, "get", "configmap", config_map, "-o",
                                    "json", check=False)  # fmt: skip
            answer = json.loads(found)["data"][SPEC_FILE_NAME] if found else None
            if answer and answer != last:
                volumes.mount_spec(POD, answer)
                last = answer
            stop.wait(0.5)

    thread = threading.Thread(target=sync, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def _latest(cluster: harness.TestCluster, namespace: str,
            capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:  # fmt: skip
    capsys.readouterr()
    assert kd(cluster, namespace, "history", "serve", "-o", "json") == 0
    rows: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    return max(rows, key=lambda r: r["revision"])


def test_up_swaps_the_drafter_into_the_running_server_and_rollback_swaps_it_back(
    swap_pod: Any,
    netns: tuple[str, str],
    pipeline_cluster: harness.TestCluster,
    cpu_python: Path,
    project: LoadedProject,
    volumes: Volumes,
    shifted_drafter: Path,
    misfit_drafter: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rendered, server, mounts, port = swap_pod
    pid, started_at = server.process.pid, _start_time(server.process.pid)

    # A spec naming a drafter vLLM cannot take without a restart: refused before any write.
    volumes.mount_spec(POD, json.dumps(pods.rendered(project, "serve", "shifted").spec))
    refused = _wait_keeper(mounts.home, lambda s: s.get("state") == "refused", "refuse shifted")
    assert "eagle_aux_hidden_state_layer_ids" in refused["reason"], refused
    assert refused["serving"] == "good"
    volumes.mount_spec(POD, json.dumps(rendered.spec))
    _wait_keeper(mounts.home, lambda s: s.get("wanted") == "good", "go back to good")
    good_before = _count(bench(cpu_python, project, volumes, "good", server))

    namespace = f"swap-{secrets.token_hex(3)}"
    cluster = pipeline_cluster
    cluster.kubectl("create", "namespace", namespace)
    wait_for(lambda: cluster.kubectl("-n", namespace, "get", "sa", "default", check=False),
             "default SA")  # fmt: skip
    for (secret, field), value in pods.SECRETS.items():
        cluster.kubectl("-n", namespace, "create", "secret", "generic", secret,
                        f"--from-literal={field}={value}")  # fmt: skip
    wait = ("--yes", "--poll", "0.3", "--scheduling-grace", "5", "--timeout", "600")
    try:
        assert kd(cluster, namespace, "up", "serve", "--drafter", "good", *wait) == 0
        pod = cluster.kubectl("-n", namespace, "get", "pods", "-o",
                              "jsonpath={.items[0].metadata.name}")  # fmt: skip
        cluster.kubectl("-n", namespace, "patch", "pod", pod, "--subresource=status",
                        "--type=merge", "-p", json.dumps({"status": {
                            "podIP": netns[1], "podIPs": [{"ip": netns[1]}]}}))  # fmt: skip
        live = cluster.kubectl("-n", namespace, "get", "deployment", "tiny-serve", "-o", "json")
        generation = json.loads(live)["metadata"]["generation"]
        with kubelet_spec_volume(cluster, namespace, "tiny-serve", volumes):
            # A swap cut off after its start left vLLM's update session open: the keeper's
            # swap closes it instead of being refused.
            assert _post_from_the_pod(cpu_python, netns[0], mounts.home, port,
                                      "/start_draft_weight_update", token=True) == 200  # fmt: skip
            capsys.readouterr()
            began = time.monotonic()
            assert kd(cluster, namespace, "up", "serve", "--drafter", "untrained", *wait) == 0
            into_s = time.monotonic() - began
            out, err = capsys.readouterr()
            assert "swap the drafter in the running pods: good -> untrained" in out + err
            into = _keeper_state(mounts.home)["swaps"][-1]
            untrained = _count(bench(cpu_python, project, volumes, "good", server))
            latest = _latest(cluster, namespace, capsys)
            assert (latest["revision"], latest["drafter"], latest["change"]) == (
                2, "untrained", "swap"), latest  # fmt: skip
            assert kd(cluster, namespace, "status", "-o", "json") == 0
            serving = json.loads(capsys.readouterr().out)["serving"]
            assert (serving["drafter"], serving["change"], serving["drafter_in_pods"]) == (
                "untrained", "swap", "1/1 pods serve untrained"), serving  # fmt: skip

            capsys.readouterr()
            began = time.monotonic()
            assert kd(cluster, namespace, "rollback", "serve", *wait) == 0
            back_s = time.monotonic() - began
            out, err = capsys.readouterr()
            assert "swap the drafter in the running pods: untrained -> good" in out + err
            back = _keeper_state(mounts.home)["swaps"][-1]
            good_after = _count(bench(cpu_python, project, volumes, "good", server))
            latest = _latest(cluster, namespace, capsys)
            assert (latest["revision"], latest["drafter"], latest["change"]) == (
                3, "good", "swap"), latest  # fmt: skip

            # A/B on the one server: the bake-off's rounds (interleave.run_rounds), each swap a
            # real `up`, each bench over the same prompts.
            def serve(name: str) -> None:
                assert kd(cluster, namespace, "up", "serve", "--drafter", name, *wait) == 0

            def bench_round(name: str) -> BenchResult:
                return BenchResult.from_dict(bench(cpu_python, project, volumes, "good", server))

            orders = interleave.round_orders(["good", "untrained"], 3)
            measured = interleave.run_rounds(orders, "good", serve, bench_round)
            rounds = {n: [_count(r.as_dict()) for r in results] for n, results in measured.items()}
            merged = {n: _count(interleave.merge_rounds(r).as_dict()) for n, r in measured.items()}
            deployment = json.loads(cluster.kubectl("-n", namespace, "get", "deployment",
                                                    "tiny-serve", "-o", "json"))  # fmt: skip
            assert deployment["metadata"]["generation"] == generation  # never replaced
            swapped = _latest(cluster, namespace, capsys)["revision"]

            # Files the registry cannot tell from good's: `up` plans a swap, the server refuses
            # it before writing, and the revision becomes a rollout of the new Deployment.
            assert kd(cluster, namespace, "up", "serve", "--drafter", "misfit", *wait) == 0
            out, err = capsys.readouterr()
            assert "the server refused the swap" in out + err, out + err
            assert "rms_norm_eps" in out + err
            latest = _latest(cluster, namespace, capsys)
            assert (latest["revision"], latest["drafter"], latest["change"]) == (
                swapped + 1, "misfit", "swap refused"), latest  # fmt: skip
            assert "swap refused: rolled out" in latest["note"]
            deployment = json.loads(cluster.kubectl("-n", namespace, "get", "deployment",
                                                    "tiny-serve", "-o", "json"))  # fmt: skip
            assert deployment["metadata"]["generation"] == generation + 1
        assert _keeper_state(mounts.home)["serving"] == "untrained"  # misfit never loaded
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)

    FIGURES["drafter swap: acceptance good / untrained swapped in / good back"] = (
        f"{good_before:.2f} / {untrained:.2f} / {good_after:.2f}"
    )
    steps = ("start_s", "load_s", "finish_s", "reset_s")
    FIGURES["drafter swap: seconds, untrained in / good back (start, load, finish, reset)"] = (
        f"{into['total_s']} ({', '.join(str(into[s]) for s in steps)}) / "
        f"{back['total_s']} ({', '.join(str(back[s]) for s in steps)})"
    )
    FIGURES["drafter swap: `up` / `rollback` wall time, spec sync included (s)"] = (
        f"{into_s:.1f} / {back_s:.1f}"
    )
    FIGURES["drafter swap: A/B rounds (untrained good | good untrained), good / untrained"] = (
        f"{', '.join(f'{c:.2f}' for c in rounds['good'])} / "
        f"{', '.join(f'{c:.2f}' for c in rounds['untrained'])}"
    )
    # The same process throughout: never restarted, never reloaded.
    assert server.process.poll() is None
    assert server.process.pid == pid and _start_time(pid) == started_at
    # vLLM counted the untrained drafter's drafts as such, and the good one's again after.
    assert untrained <= 1.2, untrained
    assert good_before >= untrained + 1.0, (good_before, untrained)
    assert good_after == pytest.approx(good_before, abs=SAME_DRAFTER_SPREAD)
    # Interleaved, each round tells them apart, and the mean is what one bench measured.
    assert len(rounds["good"]) == len(rounds["untrained"]) == 2, rounds
    assert all(g >= u + 1.0 for g, u in zip(rounds["good"], rounds["untrained"], strict=True))
    assert merged["untrained"] <= 1.2, merged
    assert merged["good"] == pytest.approx(good_before, abs=SAME_DRAFTER_SPREAD), merged
