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
import os
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
                                           netns=name, port=port,
                                           env={DRAFT_FORWARDS_ENV: "1"})  # fmt: skip
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


def _release_namespace(cluster: harness.TestCluster, namespace: str) -> None:
    """A namespace for a test's release, with the Secrets the serve pods name."""
    cluster.kubectl("create", "namespace", namespace)
    wait_for(lambda: cluster.kubectl("-n", namespace, "get", "sa", "default", check=False),
             "default SA")  # fmt: skip
    for (secret, field), value in pods.SECRETS.items():
        cluster.kubectl("-n", namespace, "create", "secret", "generic", secret,
                        f"--from-literal={field}={value}")  # fmt: skip


def _serve_good_on_the_pod(cluster: harness.TestCluster, namespace: str, address: str,
                           wait: tuple[str, ...]) -> None:  # fmt: skip
    """`up serve --drafter good`, its simulated pod given the real server's address (so the
    API server's pod proxy reaches the server the test started)."""
    assert kd(cluster, namespace, "up", "serve", "--drafter", "good", *wait) == 0
    pod = cluster.kubectl("-n", namespace, "get", "pods", "-o",
                          "jsonpath={.items[0].metadata.name}")  # fmt: skip
    cluster.kubectl("-n", namespace, "patch", "pod", pod, "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {
                        "podIP": address, "podIPs": [{"ip": address}]}}))  # fmt: skip


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
    _release_namespace(cluster, namespace)
    wait = ("--yes", "--poll", "0.3", "--scheduling-grace", "5", "--timeout", "600")
    try:
        _serve_good_on_the_pod(cluster, namespace, netns[1], wait)
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


# --- speculation switched off and on in the running server (patch 0002) -------------------------

DRAFT_FORWARDS_ENV = "KIMIDEPLOY_TEST_DRAFT_FORWARDS"
"""tests/pipeline/cpu_shim counts every EAGLE-3 draft forward into the pod's HOME when set."""
DRAFT_FORWARDS_FILE = ".kimideploy-draft-forwards"
GREEDY_TOKENS = 40
API_KEY = pods.SECRETS[("pipeline-api-key", "token")]


def _draft_forwards(home: Path) -> int:
    try:
        return int((home / DRAFT_FORWARDS_FILE).read_text())
    except (OSError, ValueError):
        return 0


def _drafts(server: pods.Server) -> float:
    """vLLM's own count of drafts (vllm:spec_decode_num_drafts_total)."""
    text = urllib.request.urlopen(server.url + "/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:spec_decode_num_drafts_total"))  # fmt: skip


def _complete(server: pods.Server, model: str, prompt: str, tokens: int = GREEDY_TOKENS,
              timeout: float = 300) -> dict[str, Any]:  # fmt: skip
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    request = urllib.request.Request(server.url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {API_KEY}"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def _greedy_prompts(count: int) -> list[str]:
    """Prompts no server of the tier has seen: a marker of their own first, so no prefix-cache
    block is shared and each server computes every token itself."""
    from tests.pipeline import stdlib_corpus

    rows = stdlib_corpus.prompt_rows("heldout", "code", count)
    return [f"# switch {secrets.token_hex(4)} {i}\n{row['prompt']}" for i, row in enumerate(rows)]


class Load:
    """Requests sent on `threads` threads until stopped, each checked whole: 200 and exactly
    `tokens` completion tokens (ignore_eos), or counted as lost with the reason."""

    def __init__(self, server: pods.Server, model: str, threads: int = 3, tokens: int = 24):
        self.server, self.model, self.tokens = server, model, tokens
        self.stop = threading.Event()
        self.done = 0
        self.lost: list[str] = []
        self.lock = threading.Lock()
        self.workers = [threading.Thread(target=self._run, args=(n,), daemon=True)
                        for n in range(threads)]  # fmt: skip

    def _run(self, worker: int) -> None:
        sent = 0
        while not self.stop.is_set():
            sent += 1
            try:
                answer = _complete(self.server, self.model,
                                   f"# load {worker}-{sent}\ndef f(x):\n", self.tokens)  # fmt: skip
                got = answer["usage"]["completion_tokens"]
                problem = "" if got == self.tokens else f"{got} of {self.tokens} tokens"
            except (OSError, ValueError, KeyError) as exc:
                problem = str(exc)
            with self.lock:
                if problem:
                    self.lost.append(problem)
                else:
                    self.done += 1

    def __enter__(self) -> Load:
        for worker in self.workers:
            worker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for worker in self.workers:
            worker.join(timeout=600)


def test_rollback_no_spec_switches_speculation_off_in_the_running_server_and_up_back_on(
    swap_pod: Any,
    netns: tuple[str, str],
    pipeline_cluster: harness.TestCluster,
    cpu_python: Path,
    project: LoadedProject,
    volumes: Volumes,
    target_server: pods.Server,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`rollback serve --no-spec` on a server that can switch (the tier's image carries patch
    0002) keeps the pods and switches speculation off in seconds: the served tokens are then
    the non-speculative server's, token for token, vLLM counts no draft and no draft forward
    runs; `up serve --drafter good` switches it back on and the acceptance is what it was.
    Switched off and on while requests stream, none is lost. One process throughout."""
    _, server, mounts, _ = swap_pod
    pid, started_at = server.process.pid, _start_time(server.process.pid)
    model = project.project.model.served_name
    namespace = f"switch-{secrets.token_hex(3)}"
    cluster = pipeline_cluster
    _release_namespace(cluster, namespace)
    wait = ("--yes", "--poll", "0.3", "--scheduling-grace", "5", "--timeout", "600")
    prompts = _greedy_prompts(6)
    try:
        _serve_good_on_the_pod(cluster, namespace, netns[1], wait)
        with kubelet_spec_volume(cluster, namespace, "tiny-serve", volumes):
            _wait_keeper(mounts.home, lambda s: (s.get("state"), s.get("serving"))
                         == ("serving", "good"), "serve good")  # fmt: skip
            on_before = _count(bench(cpu_python, project, volumes, "good", server))

            capsys.readouterr()
            began = time.monotonic()
            assert kd(cluster, namespace, "rollback", "serve", "--no-spec", *wait) == 0
            off_s = time.monotonic() - began
            out, err = capsys.readouterr()
            assert "switch speculation off in the running pods (good stays loaded)" in out + err
            switched_off = _keeper_state(mounts.home)["switches"][-1]
            latest = _latest(cluster, namespace, capsys)
            assert (latest["revision"], latest["drafter"], latest["change"]) == (
                2, "none", "speculation off"), latest  # fmt: skip
            assert kd(cluster, namespace, "status", "-o", "json") == 0
            serving = json.loads(capsys.readouterr().out)["serving"]
            assert serving["drafter_in_pods"] == "1/1 pods serve without speculation (good loaded)"

            drafts, forwards = _drafts(server), _draft_forwards(mounts.home)
            off = [_complete(server, model, p)["choices"][0]["text"] for p in prompts]
            plain = [_complete(target_server, model, p)["choices"][0]["text"] for p in prompts]
            drafts_off, forwards_off = _drafts(server) - drafts, _draft_forwards(mounts.home)
            forwards_off -= forwards

            capsys.readouterr()
            began = time.monotonic()
            assert kd(cluster, namespace, "up", "serve", "--drafter", "good", *wait) == 0
            on_s = time.monotonic() - began
            out, err = capsys.readouterr()
            assert "switch speculation on in the running pods (good)" in out + err
            switched_on = _keeper_state(mounts.home)["switches"][-1]
            forwards = _draft_forwards(mounts.home)
            on_after = _count(bench(cpu_python, project, volumes, "good", server))
            forwards_on = _draft_forwards(mounts.home) - forwards

            # Off and on again while requests stream.
            with Load(server, model) as load:
                for command in (("rollback", "serve", "--no-spec"),
                                ("up", "serve", "--drafter", "good")) * 2:  # fmt: skip
                    time.sleep(2)
                    assert kd(cluster, namespace, *command, *wait) == 0
                time.sleep(2)
            deployment = json.loads(cluster.kubectl("-n", namespace, "get", "deployment",
                                                    "tiny-serve", "-o", "json"))  # fmt: skip
            assert deployment["metadata"]["generation"] == 1  # never replaced
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)

    start_up = FIGURES.get("drafter swap: the reload it replaces, vLLM start-up (s)")
    FIGURES["speculation switch: engine off / on (s); vLLM start-up (s)"] = (
        f"{switched_off['seconds']} / {switched_on['seconds']}; {start_up}"
    )
    FIGURES["speculation switch: `rollback --no-spec` / `up` wall time, spec sync included (s)"] = (
        f"{off_s:.1f} / {on_s:.1f}"
    )
    FIGURES["speculation switch: acceptance good before / after off-on"] = (
        f"{on_before:.2f} / {on_after:.2f}"
    )
    FIGURES["speculation switch: drafts / draft forwards while off; requests under flips"] = (
        f"{drafts_off:.0f} / {forwards_off}; {load.done} completed, {len(load.lost)} lost"
    )
    assert server.process.poll() is None
    assert server.process.pid == pid and _start_time(pid) == started_at
    # Off: the non-speculative server's tokens, no draft counted, no draft pass run.
    assert off == plain
    assert drafts_off == 0 and forwards_off == 0
    # On again: the drafter drafts again and accepts what it did.
    assert forwards_on > 0 and switched_on["reset"] is True
    assert on_after == pytest.approx(on_before, abs=SAME_DRAFTER_SPREAD)
    assert on_before >= 1.5, on_before
    assert load.lost == [] and load.done >= 4, (load.done, load.lost)


BENCH_PODS = "app.kubernetes.io/component=bench"
AWAIT_BENCH = "bench.pod_annotations=" + json.dumps({"kimideploy.test/await-hook": "true"})
# The gate's four benches (two rounds of drafter and baseline) at 16 prompts, not the project's 40:
# each round's mean is what the test reads, not its precision (509.6 s at 40, under load).
GATE_BENCH = "bench.num_prompts=16"


def real_bench(cluster: harness.TestCluster, namespace: str, cpu_python: Path, project: LoadedProject,
               volumes: Volumes, server: pods.Server, logs: Path) -> Any:  # fmt: skip
    """A PodHooks choice that plays the kubelet for a bench pod: its spec (the Job's ConfigMap)
    run here by the bench workload against the real server; its output becomes the pod's log."""
    from tests.pipeline.conftest import service_urls

    def choose(pod: dict[str, Any]) -> harness.PodChoice:
        name = pod["metadata"]["name"]
        spec_map = next(v["configMap"]["name"] for v in pod["spec"]["volumes"]
                        if "configMap" in v and v["name"] == "spec")  # fmt: skip
        found = json.loads(cluster.kubectl("-n", namespace, "get", "configmap", spec_map, "-o",
                                           "json"))  # fmt: skip
        spec = pods.localize(json.loads(found["data"][SPEC_FILE_NAME]),
                             {**volumes.roots,
                              **service_urls(project, server, namespace=namespace)})  # fmt: skip
        code, out, err = pods.run_workload(cpu_python, "bench", spec, volumes.root,
                                           KIMIDEPLOY_API_KEY=API_KEY)  # fmt: skip
        lines = out.splitlines() if code == 0 else [f"bench failed: {err[-500:]}"]
        log = harness.write_container_log(logs / f"{name}.log", lines)
        return log, {"kimideploy.test/run-duration": "1s"}

    return choose


def test_the_gate_measures_its_baseline_on_the_drafters_own_pods_switched_off(
    swap_pod: Any,
    netns: tuple[str, str],
    pipeline_cluster: harness.TestCluster,
    cpu_python: Path,
    project: LoadedProject,
    volumes: Volumes,
    target_server: pods.Server,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`up serve --drafter good --gate --gate-baseline same-server`: no second server is
    loaded; the baseline is the same pods with speculation switched off, benched in rounds
    interleaved with the drafter's (each switch a recorded revision), and the verdict says so.
    The switched-off baseline's throughput is compared with the separately started
    non-speculative server's on the same bench (FIGURES)."""
    _, server, mounts, _ = swap_pod
    pid, started_at = server.process.pid, _start_time(server.process.pid)
    namespace = f"gate-{secrets.token_hex(3)}"
    cluster = pipeline_cluster
    _release_namespace(cluster, namespace)
    wait = ("--yes", "--poll", "0.3", "--scheduling-grace", "5", "--timeout", "900")
    hook = real_bench(cluster, namespace, cpu_python, project, volumes, server, tmp_path)
    try:
        _serve_good_on_the_pod(cluster, namespace, netns[1], wait)
        with (kubelet_spec_volume(cluster, namespace, "tiny-serve", volumes),
              harness.PodHooks(cluster, namespace, BENCH_PODS, hook)):  # fmt: skip
            _wait_keeper(mounts.home, lambda s: (s.get("state"), s.get("serving"))
                         == ("serving", "good"), "serve good")  # fmt: skip
            capsys.readouterr()
            code = kd(cluster, namespace, "up", "serve", "--drafter", "good", "--gate",
                      "--gate-baseline", "same-server", "--set", AWAIT_BENCH, "--set", GATE_BENCH,
                      "-o", "json",
                      *wait)  # fmt: skip
            out, err = capsys.readouterr()
        document = json.loads(out)
        verdict = document["verdict"]
        rows = _history_rows(cluster, namespace, capsys)
        deployment = json.loads(cluster.kubectl("-n", namespace, "get", "deployment",
                                                "tiny-serve", "-o", "json"))  # fmt: skip
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    assert code in (0, 4), err[-3000:]
    assert (
        "baseline measured on the drafter's own pods with speculation switched off"
        in (verdict["baseline_note"])
    )
    assert not verdict.get("gate_failed"), verdict
    # Two rounds: the drafter and the baseline each benched twice, on one server.
    assert len(verdict["run_id"].split(",")) == len(verdict["baseline_run"].split(",")) == 2
    changes = [r["change"] for r in rows]
    assert changes.count("speculation off") >= 1 and changes.count("speculation on") >= 1, rows
    assert deployment["metadata"]["generation"] == 1  # the pods were never replaced
    assert server.process.pid == pid and _start_time(pid) == started_at
    # What serves now follows the verdict: the drafter kept, or switched off by the rollback.
    last = rows[-1]
    assert last["change"] == ("speculation on" if code == 0 else "speculation off"), rows
    switched = {lv["concurrency"]: lv["baseline_tokens_per_s"] for lv in verdict["levels"]}
    separate = bench(cpu_python, project, volumes, "none", target_server, overrides=(GATE_BENCH,))
    plain = {lv["concurrency"]: lv["output_tokens_per_s"] for lv in separate["levels"]}
    FIGURES["gate same-server: baseline tok/s switched off / separate server (c=4)"] = (
        f"{switched[4]:.1f} / {plain[4]:.1f} ({switched[4] / plain[4]:.2f}x); verdict "
        f"{verdict['decision']} at {verdict['levels'][0].get('speedup')}"
    )


def _history_rows(cluster: harness.TestCluster, namespace: str,
                  capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:  # fmt: skip
    capsys.readouterr()
    assert kd(cluster, namespace, "history", "serve", "-o", "json") == 0
    rows: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    return sorted(rows, key=lambda r: r["revision"])


# --- what a live swap reads, on the engine (issue: a swap can hang serving) ----------------------


def _spec_naming(project: LoadedProject, name: str, **changes: Any) -> str:
    """The rendered good revision's spec, naming the drafter folder /models/drafters/NAME."""
    spec = dict(pods.rendered(project, "serve", "good").spec)
    spec.update(drafter=name, drafter_path=f"/models/drafters/{name}", speculation=True)
    spec.update(changes)
    return json.dumps(spec)


def _candidate(volumes: Volumes, source: Path, name: str) -> Path:
    out = volumes.root / "models" / "drafters" / name
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(source, out)
    return out


def test_a_swap_reads_its_candidate_once_as_untrusted_input_while_requests_stream(
    swap_pod: Any,
    project: LoadedProject,
    volumes: Volumes,
    good_drafter: dict[str, Any],
    untrained_drafter: dict[str, Any],
) -> None:
    """Candidates a shared volume can hold: a FIFO for config.json (it blocked the engine's
    collective call forever, /health still answering), a link to /dev/zero (read until memory
    ran out), a header over no data and a truncated file (half-written), a folder outside the
    models mount, files other than the release recorded, and files replaced while the swap
    reads them. Each is refused within seconds while requests stream, none is lost, and the
    good drafter goes on serving the same greedy tokens; the process never restarts."""
    from kimideploy.formats.drafter_swap import hold_drafter

    _, server, mounts, _ = swap_pod
    pid, started_at = server.process.pid, _start_time(server.process.pid)
    model = project.project.model.served_name
    good, untrained = Path(good_drafter["out"]), Path(untrained_drafter["out"])
    volumes.mount_spec(POD, _spec_naming(project, "good"))
    _wait_keeper(mounts.home, lambda s: (s.get("state"), s.get("serving"), s.get("speculation"))
                 == ("serving", "good", "on"), "serve good with speculation on")  # fmt: skip
    prompts = _greedy_prompts(3)
    reference = [_complete(server, model, p)["choices"][0]["text"] for p in prompts]

    fifo = _candidate(volumes, good, "fifo")
    (fifo / "config.json").unlink()
    os.mkfifo(fifo / "config.json")
    zero = _candidate(volumes, good, "zero")
    [weights] = sorted(zero.glob("*.safetensors"))
    weights.unlink()
    weights.symlink_to("/dev/zero")
    header_only = _candidate(volumes, untrained, "header-only")
    [weights] = sorted(header_only.glob("*.safetensors"))
    raw = weights.read_bytes()
    weights.write_bytes(raw[: 8 + int.from_bytes(raw[:8], "little")])
    truncated = _candidate(volumes, untrained, "truncated")
    [weights] = sorted(truncated.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-4096])
    outside = volumes.root / "elsewhere" / "drafter"
    shutil.rmtree(outside.parent, ignore_errors=True)
    shutil.copytree(untrained, outside)
    good_files = hold_drafter(good).sha256s()
    cases = [
        (_spec_naming(project, "fifo"), "not a regular file"),
        (_spec_naming(project, "zero"), "symbolic link"),
        (_spec_naming(project, "header-only"), "truncated"),
        (_spec_naming(project, "truncated"), "truncated"),
        (_spec_naming(project, "outside", drafter_path="/elsewhere/drafter"), "models mount"),
        (_spec_naming(project, "untrained", drafter_sha256=good_files), "sha256"),
    ]
    refusals: dict[str, float] = {}
    with Load(server, model) as load:
        for spec, named in cases:
            began = time.monotonic()
            volumes.mount_spec(POD, spec)
            wanted = json.loads(spec)["drafter"]
            state = _wait_keeper(mounts.home, lambda s, w=wanted: s.get("state") == "refused"
                                 and s.get("wanted") == w, f"refuse {wanted}", 120)  # fmt: skip
            refusals[wanted] = round(time.monotonic() - began, 1)
            assert named in state["reason"], state
            assert state["serving"] == "good", state
        # Files replaced under the swap: the release lists untrained's; a writer swaps the
        # folder's weights between untrained's and good's bytes while the keeper and the
        # engine read them. Whatever is loaded is exactly what the release listed, or nothing.
        flip = _candidate(volumes, untrained, "flip")
        [weights] = sorted(flip.glob("*.safetensors"))
        listed = hold_drafter(flip).sha256s()
        versions = [
            weights.read_bytes(),
            next(iter(sorted(good.glob("*.safetensors")))).read_bytes(),
        ]
        stop = threading.Event()

        def flipping() -> None:
            turn = 0
            while not stop.is_set():
                draft = weights.with_name(".flip.tmp")
                draft.write_bytes(versions[turn % 2])
                draft.replace(weights)
                turn += 1
                stop.wait(0.005)

        writer = threading.Thread(target=flipping, daemon=True)
        writer.start()
        try:
            volumes.mount_spec(POD, _spec_naming(project, "flip", drafter_sha256=listed))
            flipped = _wait_keeper(mounts.home, lambda s: s.get("wanted") == "flip"
                                   and s.get("state") in ("serving", "refused"), "judge flip",
                                   120)  # fmt: skip
        finally:
            stop.set()
            writer.join(timeout=30)
        volumes.mount_spec(POD, _spec_naming(project, "good"))
        _wait_keeper(mounts.home, lambda s: (s.get("state"), s.get("serving"))
                     == ("serving", "good"), "swap good back", 120)  # fmt: skip
    after = [_complete(server, model, p)["choices"][0]["text"] for p in prompts]
    FIGURES["swap safety: seconds to refuse fifo / zero / header-only / truncated / outside / "
            "sha256; requests under the refusals"] = (
        " / ".join(str(refusals[k]) for k in ("fifo", "zero", "header-only", "truncated",
                                                "outside", "untrained"))
        + f"; {load.done} completed, {len(load.lost)} lost"
    )  # fmt: skip
    FIGURES["swap safety: files replaced during the swap"] = (
        f"{flipped['state']}: {flipped.get('reason') or 'the listed bytes were loaded'}"[:160]
    )
    assert load.lost == [] and load.done >= 3, (load.done, load.lost)
    assert after == reference  # the good drafter served throughout: the same greedy tokens
    if flipped["state"] == "refused":
        assert "sha256" in flipped["reason"], flipped
    else:
        assert flipped["verified"] is True, flipped
    assert server.process.poll() is None
    assert server.process.pid == pid and _start_time(pid) == started_at
