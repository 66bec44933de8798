"""A drafter replaced in a running vLLM 0.32 without restarting it, on the engine.

The good drafter is served with the rendered arguments (kimideploy's weight-transfer backend, the
development-routes guard, vLLM's development mode) and benched; the untrained drafter is swapped
in through the swap client run as `kubectl exec` runs it (inside the pod: its HOME, its loopback
address) and vLLM's count drops to about 1; the good drafter is swapped back and the count
returns, with the same process, started at the same time. A drafter that vLLM cannot take without
a restart (layer ids one off: the target captures other layers) is refused before any weight is
written, and the good drafter goes on serving. From any address but the pod's own, and without
the pod's token, the development routes answer 403."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from tests.pipeline import pods
from tests.pipeline.conftest import Volumes, bench
from tests.pipeline.figures import FIGURES

from kimideploy.config.loading import LoadedProject
from kimideploy.formats.drafter_swap import DEV_ROUTES_GUARD, DRAFTER_FILES_BACKEND
from kimideploy.workloads.drafter_swap import TOKEN_FILE_NAME, TOKEN_HEADER

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


def _outside_address() -> str:
    """This machine's address on its default route: not loopback, as another pod's would be."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent for a UDP connect
        address = str(probe.getsockname()[0])
    assert not address.startswith("127."), "no non-loopback address to call from"
    return address


def _status(url: str, method: str = "POST", headers: dict[str, str] | None = None) -> int:
    data = b"{}" if method == "POST" else None
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _swap(python: Path, home: Path, url: str, drafter: Path, version: str) -> dict[str, Any]:
    """`kubectl exec` into the serving container: the pod's HOME (its token), its loopback."""
    done = subprocess.run(
        [str(python), "-m", "kimideploy.workloads.drafter_swap", "--drafter", str(drafter),
         "--version", version, "--url", url],
        capture_output=True, text=True, timeout=900, env=pods.cpu_env(python, HOME=str(home)),
    )  # fmt: skip
    event: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    event["returncode"] = done.returncode
    return event


@pytest.fixture(scope="module")
def swap_server(
    cpu_python: Path,
    project: LoadedProject,
    volumes: Volumes,
    good_drafter: dict[str, Any],
    untrained_drafter: dict[str, Any],
    shifted_drafter: Path,
) -> Any:
    rendered = pods.rendered(project, "serve", "good")
    started = time.monotonic()
    # On every address, as in a pod: the guard test calls it from outside the loopback.
    server, mounts = volumes.start_serving(cpu_python, rendered, "serve-swap", host="0.0.0.0")
    server.url = server.url.replace("0.0.0.0", "127.0.0.1")
    try:
        pods.wait_ready([server])
        FIGURES["drafter swap: the reload it replaces, vLLM start-up (s)"] = round(
            time.monotonic() - started, 1
        )
        yield rendered, server, mounts
    finally:
        server.stop()


def test_the_rendered_server_can_swap_and_guards_its_development_routes(
    swap_server: Any,
) -> None:
    rendered, server, _ = swap_server
    args = rendered.vllm_args
    assert json.loads(args[args.index("--weight-transfer-config") + 1]) == {
        "backend": DRAFTER_FILES_BACKEND
    }
    assert args[args.index("--middleware") + 1] == DEV_ROUTES_GUARD
    assert rendered.vllm_env.get("VLLM_SERVER_DEV_MODE") == "1"
    port = server.url.rsplit(":", 1)[1]
    outside = f"http://{_outside_address()}:{port}"
    # From another address (the Service, another pod): no development route, token or not.
    for path in ("/start_draft_weight_update", "/collective_rpc", "/reset_prefix_cache"):
        assert _status(outside + path) == 403, path
    assert _status(outside + "/server_info", "GET") == 403
    # From the pod itself but without the token (a mesh proxy forwarding to loopback).
    assert _status(server.url + "/start_draft_weight_update") == 403
    # The serving routes are not the guard's business.
    assert _status(outside + "/health", "GET") == 200


def test_a_swapped_drafter_is_served_without_restarting_and_swaps_back(
    swap_server: Any,
    cpu_python: Path,
    project: LoadedProject,
    volumes: Volumes,
) -> None:
    _, server, mounts = swap_server
    pid, started_at = server.process.pid, _start_time(server.process.pid)
    drafters = volumes.root / "models" / "drafters"

    refused = _swap(cpu_python, mounts.home, server.url, drafters / "shifted", "shifted")
    assert refused["returncode"] == 1 and not refused["ok"], refused
    assert "eagle_aux_hidden_state_layer_ids" in refused["error"], refused["error"]
    good_before = _count(bench(cpu_python, project, volumes, "good", server))

    # A swap cut off after its start (the exec killed) leaves vLLM's update session open; the
    # next swap closes it instead of being refused.
    token = (mounts.home / TOKEN_FILE_NAME).read_text().strip()
    opened = _status(server.url + "/start_draft_weight_update", headers={TOKEN_HEADER: token})
    assert opened == 200
    into = _swap(cpu_python, mounts.home, server.url, drafters / "untrained", "untrained")
    assert into["ok"] and into["weight_version"] == "untrained", into
    untrained = _count(bench(cpu_python, project, volumes, "good", server))

    back = _swap(cpu_python, mounts.home, server.url, drafters / "good", "good")
    assert back["ok"] and back["weight_version"] == "good", back
    good_after = _count(bench(cpu_python, project, volumes, "good", server))

    FIGURES["drafter swap: acceptance good / untrained swapped in / good back"] = (
        f"{good_before:.2f} / {untrained:.2f} / {good_after:.2f}"
    )
    steps = ("start_s", "load_s", "finish_s", "reset_s")
    FIGURES["drafter swap: seconds, untrained in / good back (start, load, finish, reset)"] = (
        f"{into['total_s']} ({', '.join(str(into[s]) for s in steps)}) / "
        f"{back['total_s']} ({', '.join(str(back[s]) for s in steps)})"
    )
    # The same process throughout: never restarted, never reloaded.
    assert server.process.poll() is None
    assert server.process.pid == pid and _start_time(pid) == started_at
    # vLLM counted the untrained drafter's drafts as such, and the good one's again after.
    assert untrained <= 1.2, untrained
    assert good_before >= untrained + 1.0, (good_before, untrained)
    assert good_after == pytest.approx(good_before, abs=SAME_DRAFTER_SPREAD)
