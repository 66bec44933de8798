"""The training launcher (workloads/launch.py) with real torch.distributed ranks on CPU (gloo):
each exit code the workload protocol documents reaches the Job as itself (0, 75 resumable, 2 bad
input, 1 a failure), a SIGTERM drains every rank to 75, and, for contrast, torchrun itself turns
a rank's 75 into 1 (the defect the launcher replaces). The real train workload, drained under the
launcher with two ranks, exits 75. The Job controller's side (75 restarts the index, 2 fails it)
is tests/integration/test_batch_scheduling.py's."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.ports import free_port
from tests.workloads.conftest import workloads_python
from tests.workloads.test_train import features, train_spec  # noqa: F401 (a fixture)

WORKER = """
import os, signal, sys, time
import torch
import torch.distributed as dist
signal.signal(signal.SIGTERM, lambda *_: os._exit(75))  # as the workloads drain: exit 75
dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
rank = dist.get_rank()
# One write per line: the ranks share the launcher's stdout, and print() under
# PYTHONUNBUFFERED=1 writes the text and its newline apart, so two ranks' lines could merge.
line = json.dumps({"rank": rank, "world": dist.get_world_size(), "sum": int(total.item()),
                   "local": os.environ["LOCAL_RANK"]})
os.write(1, (line + "\\n").encode())
code = int(os.environ.get("EXIT", "-1"))
if rank == 1 and code >= 0:
    os._exit(code)
if os.environ.get("WAIT"):
    time.sleep(600)
dist.barrier()
dist.destroy_process_group()
""".replace("import os,", "import json, os,")


@pytest.fixture(scope="module")
def python() -> Path:
    return workloads_python()


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1", **extra}


def launch(python: Path, worker: Path, *, nproc: int = 2, **extra: str) -> subprocess.Popen[str]:
    command = [str(python), "-m", "kimideploy.workloads.launch", f"--nproc-per-node={nproc}",
               f"--master-port={free_port()}", "--grace-s", "3", "--", str(worker)]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env(**extra))  # fmt: skip


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("launcher") / "worker.py"
    path.write_text(WORKER)
    return path


def test_every_rank_gets_torchruns_variables_and_success_is_zero(
    python: Path, worker: Path
) -> None:
    process = launch(python, worker)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    ranks = sorted(json.loads(line)["rank"] for line in out.splitlines() if line.startswith("{"))
    assert ranks == [0, 1]
    assert all(json.loads(line)["sum"] == 2 for line in out.splitlines() if line.startswith("{"))


@pytest.mark.parametrize("code", [75, 2, 1])
def test_a_ranks_exit_code_reaches_the_job_as_itself(python: Path, worker: Path, code: int) -> None:
    """Rank 1 exits with `code` while rank 0 waits for it at a barrier: the launcher exits with
    rank 1's code (the cause), whatever rank 0 did after it."""
    process = launch(python, worker, EXIT=str(code))
    _, err = process.communicate(timeout=120)
    assert process.returncode == code, err


def test_torchrun_itself_turns_a_ranks_75_into_1(python: Path, worker: Path) -> None:
    """The defect: torchrun's elastic agent raises ChildFailedError for any non-zero worker, so
    the pod exited 1 and the train Job's podFailurePolicy rule for 75 never matched."""
    command = [str(python), "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone",
               str(worker)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=180,
                          env=env(EXIT="75"))  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    assert "exitcode  : 75" in done.stderr  # it saw the 75, and exited 1 anyway


def test_sigterm_drains_every_rank_to_75(python: Path, worker: Path) -> None:
    process = launch(python, worker, WAIT="1")
    assert process.stdout is not None
    # Both ranks' lines before the SIGTERM (both past their collective), read from the raw pipe
    # with a deadline: a rank that never prints fails the test instead of hanging it.
    fd, out = process.stdout.fileno(), b""
    deadline = time.monotonic() + 120
    while out.count(b"\n{") + out.startswith(b"{") < 2 and time.monotonic() < deadline:
        if select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            out += chunk
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert out.count(b"\n{") + out.startswith(b"{") == 2, (out, err[-2000:])
    assert process.returncode == 75, err


def test_the_train_workload_drained_under_the_launcher_exits_75(
    tmp_path: Path,
    python: Path,
    tiny_model: Path,
    features: Path,  # noqa: F811
) -> None:
    """Two real training ranks (gloo), the kubelet's SIGTERM once the first step is reported:
    both checkpoint and exit 75, and so does the launcher (torchrun would have exited 1)."""
    spec = train_spec(tmp_path, features, tiny_model, epochs=50, checkpoint_every_steps=1,
                      batch_size=2)  # fmt: skip
    command = [str(python), "-m", "kimideploy.workloads.launch", "--nproc-per-node=2",
               f"--master-port={free_port()}", "--grace-s", "10", "--", "-m",
               "kimideploy.workloads", "train", "--spec", str(spec)]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env())  # fmt: skip
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("{") and json.loads(line).get("event") == "progress":
            process.send_signal(signal.SIGTERM)
            break
    _, err = process.communicate(timeout=300)
    assert process.returncode == 75, err[-3000:]
