"""train, online mode: hidden states computed per sample by the target server beside the trainer.

Online training against a real vLLM sidecar started with the rendered flags runs in
tests/pipeline (vLLM 0.32's CPU build runs extract_hidden_states). What stays here needs a server
that can be made to misbehave or that computes exactly what offline extraction stored: the CPU
stand-in tests/workloads/hidden_states_server.py, started with the same rendered flags, computing
the layers with the tiny target's own forward pass and writing them in the connector's layout
(with 0.32's lock file). It proves online == offline step for step (one rank and two), resume
after SIGTERM, and the refusals (another model, other layers, no server).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.specs import OnlineTrainSpec
from kimideploy.plan.online import server_args
from kimideploy.plan.vllm_server import ServerBase
from tests.conftest import REPO
from tests.workloads.conftest import HERE, free_port
from tests.workloads.test_train import (
    events,
    features,
    losses,
    offline_losses,
    stop_after,
    train,
    train_spec,
    two_ranks,
)

__all__ = ["features"]  # the module-scoped pipeline fixture, shared with test_train


class Server:
    def __init__(self, process: subprocess.Popen[bytes], url: str, storage: Path, record: Path):
        self.process, self.url, self.storage, self.record = process, url, storage, record

    def requests(self) -> list[dict[str, Any]]:
        if not self.record.is_file():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def online(self, conversations: Path, **changes: Any) -> dict[str, Any]:
        return online_settings(self.url, self.storage, conversations, **changes)


def online_settings(url: str, storage: Path, conversations: Path, **changes: Any) -> dict[str, Any]:
    values = {"endpoint": f"{url}/v1", "storage_dir": str(storage),
              "conversations_dir": str(conversations), "aux_layer_ids": [1, 2, 4],
              "request_timeout_s": 60, "max_retries": 1, "server_wait_s": 60,
              "concurrency": 3, **changes}  # fmt: skip
    return OnlineTrainSpec(**values).model_dump()


def flags(
    port: int, storage: Path, served: str = "tiny", ids: tuple[int, ...] = (1, 2)
) -> list[str]:
    server = ServerBase(served_name=served, port=port, tensor_parallel_size=1, max_model_len=514,
                        gpu_memory_utilization=0.9, trust_remote_code=True)  # fmt: skip
    return server_args(server, dtype="float32", vllm_ids=list(ids), num_hidden_layers=4,
                       storage=str(storage))  # fmt: skip


def start_server(
    python: Path, model: Path, where: Path, served: str = "tiny", ids: tuple[int, ...] = (1, 2),
    port: int = 0,
) -> Server:  # fmt: skip
    port, storage, record = port or free_port(), where / "scratch", where / "requests.jsonl"
    where.mkdir(parents=True, exist_ok=True)
    command = [str(python), str(HERE / "hidden_states_server.py"), "serve", str(model),
               *flags(port, storage, served, ids), "--record", str(record)]  # fmt: skip
    log = (where / "server.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5):
                return Server(process, url, storage, record)
        except OSError:
            if process.poll() is not None:
                break
            time.sleep(0.5)
    process.kill()
    pytest.fail(f"the stand-in server did not start: {(where / 'server.log').read_text()[-2000:]}")


@pytest.fixture
def server(tmp_path: Path, torch_python: Path, tiny_model: Path) -> Iterator[Server]:
    running = start_server(torch_python, tiny_model, tmp_path / "server")
    yield running
    running.process.terminate()
    running.process.wait(timeout=30)


def test_online_training_is_offline_training_without_the_storage(
    tmp_path: Path, speculators_python: Path, tiny_model: Path, features: Path, server: Server
) -> None:
    settings = {"epochs": 4, "batch_size": 2, "checkpoint_every_steps": 1000}
    offline = offline_losses(
        speculators_python, tmp_path / "offline", features, tiny_model, **settings
    )
    online_spec = train_spec(tmp_path / "online", features, tiny_model, mode="online",
                             hidden_states_dir=str(tmp_path / "nothing-stored"),
                             online=server.online(features / "conv"), **settings)  # fmt: skip
    code, out, err = train(speculators_python, online_spec)
    assert code == 0, err
    online = losses(out)
    assert sorted(online) == sorted(offline) == list(range(1, 9))
    for step, loss in online.items():
        assert loss == pytest.approx(offline[step], rel=1e-4, abs=1e-6), step
    # Each sample asked for once per epoch, as a prefill of its token ids; every file read is gone.
    asked = server.requests()
    assert len(asked) == 4 * 4 and {r["max_tokens"] for r in asked} == {1}
    assert all(isinstance(t, int) for r in asked for t in r["prompt"])
    assert list(server.storage.iterdir()) == []
    lineage = json.loads((tmp_path / "online" / "drafter" / "kimideploy-lineage.json").read_text())
    assert lineage["dataset"]["mode"] == "online" and lineage["dataset"]["samples"] == 4
    assert lineage["dataset"]["server_aux_layer_ids"] == [1, 2, 4]
    config = json.loads((tmp_path / "online" / "drafter" / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2]


def test_a_stopped_online_run_resumes_without_asking_for_what_it_already_trained_on(
    tmp_path: Path, speculators_python: Path, tiny_model: Path, features: Path, server: Server
) -> None:
    settings = {"epochs": 10, "batch_size": 2, "checkpoint_every_steps": 1000}
    straight = offline_losses(
        speculators_python, tmp_path / "straight", features, tiny_model, **settings
    )
    spec = train_spec(tmp_path / "stopped", features, tiny_model, mode="online",
                      online=server.online(features / "conv"), **settings)  # fmt: skip
    stopped_at, _ = stop_after(speculators_python, spec, 3)
    assert 3 <= stopped_at < 20
    before = len(server.requests())
    code, out, err = train(speculators_python, spec)
    assert code == 0, err
    assert events(out, "resumed")[0]["step"] == stopped_at
    # The resumed pod asks only for the batches it has left: two samples per remaining step.
    assert len(server.requests()) - before == (20 - stopped_at) * 2
    for step, loss in losses(out).items():
        assert loss == pytest.approx(straight[step], rel=1e-4, abs=1e-6), step
    assert list(server.storage.iterdir()) == []


def test_ranks_started_before_their_server_wait_for_it_then_train_as_offline_ranks_do(
    tmp_path: Path, speculators_python: Path, torch_python: Path, tiny_model: Path, features: Path
) -> None:
    """The trainer starts beside the loading server (no startup probe holds it back) and waits."""
    settings = {"epochs": 3, "batch_size": 1, "checkpoint_every_steps": 1000}
    offline = two_ranks(speculators_python, train_spec(tmp_path / "offline", features, tiny_model,
                                                       **settings))  # fmt: skip
    offline_out, offline_err = offline.communicate(timeout=600)
    assert offline.returncode == 0, offline_err[-3000:]
    port, where = free_port(), tmp_path / "server"
    online = online_settings(f"http://127.0.0.1:{port}", where / "scratch", features / "conv",
                             server_wait_s=300)  # fmt: skip
    spec = train_spec(tmp_path / "online", features, tiny_model, mode="online", online=online,
                      **settings)  # fmt: skip
    ranks = two_ranks(speculators_python, spec)
    time.sleep(5)
    if ranks.poll() is not None:  # it should still be waiting: nothing answers yet
        _, early = ranks.communicate()
        pytest.fail(f"the ranks ended ({ranks.returncode}) before their server: {early[-3000:]}")
    server = start_server(torch_python, tiny_model, where, port=port)
    try:
        out, err = ranks.communicate(timeout=600)
    finally:
        server.process.terminate()
        server.process.wait(timeout=30)
    assert ranks.returncode == 0, err[-3000:]
    trained, expected = losses(out), losses(offline_out)
    assert sorted(trained) == sorted(expected) == list(range(1, 7))
    for step, loss in trained.items():
        assert loss == pytest.approx(expected[step], rel=1e-4, abs=1e-6), step
    # Each rank asked for its own share, once per epoch: 4 samples x 3 epochs in all.
    assert len(server.requests()) == 12 and list(server.storage.iterdir()) == []


def test_a_server_that_is_not_the_target_is_refused(
    tmp_path: Path, speculators_python: Path, torch_python: Path, tiny_model: Path, features: Path
) -> None:
    other = start_server(torch_python, tiny_model, tmp_path / "other", served="someone-else")
    wrong_layers = start_server(torch_python, tiny_model, tmp_path / "wrong", ids=(1, 2, 3))
    try:
        for server, message in [
            (other, "serves someone-else, not tiny"),
            (wrong_layers, "returned hidden states that do not belong to sample"),
        ]:
            spec = train_spec(tmp_path / message[:8], features, tiny_model, mode="online",
                              online=server.online(features / "conv"), epochs=1)  # fmt: skip
            code, _, err = train(speculators_python, spec)
            assert code == 2 and message in err, err
            assert not (tmp_path / message[:8] / "drafter").exists()
            assert list(server.storage.iterdir()) == []  # the wrong file was deleted all the same
    finally:
        for server in (other, wrong_layers):
            server.process.terminate()
            server.process.wait(timeout=30)
    # No server at all: the pod waits its budget, then fails (exit 1) and is retried by the Job.
    gone = Server(other.process, f"http://127.0.0.1:{free_port()}", tmp_path / "s", tmp_path / "r")
    spec = train_spec(tmp_path / "none", features, tiny_model, mode="online",
                      online=gone.online(features / "conv", server_wait_s=3), epochs=1)  # fmt: skip
    code, _, err = train(speculators_python, spec)
    assert code == 1 and "did not answer within 3 s" in err
    # A port that answers before it speaks HTTP (a sidecar still starting) is waited for too.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        answering = threading.Thread(target=answer_garbage, args=(listener,), daemon=True)
        answering.start()
        port = listener.getsockname()[1]
        garbled = Server(other.process, f"http://127.0.0.1:{port}", tmp_path / "g", tmp_path / "r")
        spec = train_spec(tmp_path / "garbled", features, tiny_model, mode="online",
                          online=garbled.online(features / "conv", server_wait_s=3), epochs=1)  # fmt: skip
        code, _, err = train(speculators_python, spec)
    assert code == 1 and "did not answer within 3 s" in err, err[-3000:]


def answer_garbage(listener: socket.socket) -> None:
    """Every connection gets a line that is not an HTTP status line, then is closed."""
    while True:
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        with connection:
            connection.sendall(b"not http\r\n\r\n")


def test_the_gpu_check_script_agrees_with_the_reference_through_the_stand_in(
    tmp_path: Path, torch_python: Path, tiny_model: Path, features: Path
) -> None:
    """scripts/gpu-check-online is what a GPU session runs against real vLLM; here it runs against
    the stand-in so its flags, client and comparison stay working between GPU sessions."""
    server = f"{torch_python} {HERE / 'hidden_states_server.py'}"
    command = [str(torch_python), str(REPO / "scripts" / "gpu-check-online"), str(tiny_model),
               str(features / "conv"), "--dtype", "float32", "--server", server]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["samples"] == 4 and summary["failures"] == []
    assert summary["worst_relative_error"] < 1e-5


def train_while(python: Path, spec: Path, step: int, action: Any) -> tuple[int, str, str]:
    """Run training; once `step` is reported, call `action()` (while it keeps training)."""
    from tests.workloads.conftest import run_workload

    process = run_workload("train", spec, python=str(python))
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("{") and json.loads(line).get("step", 0) >= step:
            action()
            break
    rest, err = process.communicate(timeout=600)
    return process.returncode, "".join(lines) + rest, err


def test_a_server_that_drops_and_reloads_within_its_budget_does_not_stop_training(
    tmp_path: Path, speculators_python: Path, torch_python: Path, tiny_model: Path, features: Path
) -> None:
    """The kubelet restarts a dropped sidecar, which reloads the target (~25 minutes for Kimi):
    the trainer waits for it within its startup budget and goes on where it was, step for step
    what it would have computed, instead of failing a minute later."""
    settings = {"epochs": 8, "batch_size": 2, "checkpoint_every_steps": 1000}
    offline = offline_losses(
        speculators_python, tmp_path / "offline", features, tiny_model, **settings
    )
    port, where = free_port(), tmp_path / "server"
    first = start_server(torch_python, tiny_model, where, port=port)
    online = online_settings(first.url, where / "scratch", features / "conv", server_wait_s=300,
                             max_retries=1)  # fmt: skip
    spec = train_spec(tmp_path / "online", features, tiny_model, mode="online", online=online,
                      **settings)  # fmt: skip
    restarted: list[Server] = []

    def drop_and_reload() -> None:
        first.process.kill()
        first.process.wait(timeout=30)
        time.sleep(8)  # the trainer's quick retries run out while nothing answers
        restarted.append(start_server(torch_python, tiny_model, where, port=port))

    try:
        code, out, err = train_while(speculators_python, spec, 3, drop_and_reload)
    finally:
        for server in restarted:
            server.process.terminate()
            server.process.wait(timeout=30)
    assert code == 0, err[-3000:]
    assert "waiting for it" in err and "waiting for the target server" in err
    trained = losses(out)
    assert sorted(trained) == sorted(offline) == list(range(1, 17))
    for step, loss in trained.items():
        assert loss == pytest.approx(offline[step], rel=1e-4, abs=1e-6), step


def test_a_server_that_does_not_come_back_exits_with_the_retry_code(
    tmp_path: Path, speculators_python: Path, torch_python: Path, tiny_model: Path, features: Path
) -> None:
    """Past its budget the pod exits 75: the Job starts it again without counting a failure (a
    gang's other ranks too), and it resumes from its last checkpoint."""
    server = start_server(torch_python, tiny_model, tmp_path / "server")
    spec = train_spec(tmp_path / "online", features, tiny_model, mode="online", epochs=8,
                      batch_size=2, checkpoint_every_steps=2,
                      online=server.online(features / "conv", server_wait_s=3, max_retries=0))  # fmt: skip

    def drop() -> None:
        server.process.kill()
        server.process.wait(timeout=30)

    code, _, err = train_while(speculators_python, spec, 3, drop)
    assert code == 75, err[-3000:]
    assert "did not answer within 3 s" in err
    assert "the Job starts this pod again, which waits for its server and resumes" in err
    assert list((tmp_path / "online" / "ckpt").glob("step-*/state.json"))  # what it resumes from
