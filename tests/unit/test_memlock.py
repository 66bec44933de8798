"""Locked memory for NCCL over InfiniBand: the trainer's first init container
(workloads/memlock_check.py) against real processes with the limits a node gives, as root and
as the non-root user the trainer runs as (where `capabilities.add: [IPC_LOCK]` does not reach);
`host check`'s reading of the runtime's LimitMEMLOCK; the rendered Job."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from kimideploy.config.loading import LoadedProject
from kimideploy.plan.model import PlanRequest
from kimideploy.plan.resolve import resolve
from kimideploy.services.hosts.hostcheck import memlock_checks, parse_memlock
from kimideploy.workloads.memlock_check import CAP_IPC_LOCK, UNLIMITED, verdict
from tests.conftest import REPO

TRAINER_UID = 10001


def check(soft: int, *args: str, as_user: int | None) -> subprocess.CompletedProcess[str]:
    """The check in a process with RLIMIT_MEMLOCK `soft` (hard the same), as `as_user` (None:
    this test's own user)."""

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (soft, soft))
        if as_user is not None:
            os.setgid(as_user)
            os.setuid(as_user)  # a non-root process: no effective capabilities left

    python = SYSTEM_PYTHON if as_user is not None else sys.executable
    return subprocess.run([python, "-m", "kimideploy.workloads.memlock_check", *args],
                          capture_output=True, text=True, preexec_fn=limited, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})  # fmt: skip


SYSTEM_PYTHON = "/usr/bin/python3"
"""An interpreter the trainer's user can run (this test's venv may live in root's home); the
check is standard library only."""


@pytest.fixture
def as_root() -> None:
    """Changing the user needs root, and /usr/bin/python3 for that user: skipped on a developer's
    unprivileged machine, a failure in CI (which runs as root)."""
    if os.geteuid() == 0 and os.access(SYSTEM_PYTHON, os.X_OK):
        return
    reason = "changing the user needs root, and /usr/bin/python3 for that user"
    if os.environ.get("KIMIDEPLOY_REQUIRE_PIPELINE") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


needs_root = pytest.mark.usefixtures("as_root")


@needs_root
def test_a_non_root_trainer_under_a_low_limit_is_stopped_with_the_nodes_fix() -> None:
    done = check(64 * 1024, as_user=TRAINER_UID)
    assert done.returncode == 2, done.stderr
    assert "RLIMIT_MEMLOCK soft 0.0625 MiB, hard 0.0625 MiB; CAP_IPC_LOCK not effective" in (
        done.stderr
    )
    assert "LimitMEMLOCK=infinity" in done.stderr and "host provision" in done.stderr


@needs_root
def test_a_limit_the_run_accepts_lets_the_non_root_trainer_pin() -> None:
    """A finite limit at least --min-mib passes (unlimited, what the node should give, is the
    verdict's own case: a container may not raise its hard limit, so it cannot be set here)."""
    done = check(8 * 2**20, "--min-mib", "4", as_user=TRAINER_UID)
    assert done.returncode == 0 and "soft 8 MiB" in done.stderr, done.stderr


@needs_root
def test_a_root_process_pins_whatever_the_limit_with_its_ipc_lock() -> None:
    done = check(64 * 1024, as_user=None)
    assert done.returncode == 0 and "CAP_IPC_LOCK effective" in done.stderr, done.stderr


def test_the_verdict_accepts_unlimited_a_large_enough_limit_or_the_capability() -> None:
    assert verdict(UNLIMITED, UNLIMITED, 0, None)[0]
    assert not verdict(8 * 2**20, 8 * 2**20, 0, None)[0]
    assert verdict(8 * 2**20, 8 * 2**20, 0, 4 * 2**20)[0]
    assert verdict(64 * 1024, 64 * 1024, 1 << CAP_IPC_LOCK, None)[0]


SYSTEMCTL = """LimitMEMLOCK=8388608 LoadState=loaded unit=k3s
LimitMEMLOCK=infinity LoadState=not-found unit=containerd
"""


def test_host_check_reads_the_runtimes_limit_and_blocks_only_where_nccl_uses_rdma(
    example: LoadedProject,
) -> None:
    assert parse_memlock(SYSTEMCTL) == {"k3s": "8388608"}
    [pcie] = memlock_checks(example.project.clusters["rtx6000"], SYSTEMCTL)
    assert (pcie.ok, pcie.blocking) == (False, False)  # no RDMA there: a warning
    assert "k3s.service" in pcie.fix and "LimitMEMLOCK=infinity" in pcie.fix
    [b300] = memlock_checks(
        example.project.clusters["b300"], SYSTEMCTL.replace("k3s", "containerd", 1)
    )
    # The example's b300 names an RDMA device plugin: NCCL pins there, so a low limit blocks.
    assert example.project.clusters["b300"].network.rdma_resource
    assert (b300.ok, b300.blocking) == (False, True)
    fixed = "LimitMEMLOCK=infinity LoadState=loaded unit=containerd\n"
    assert memlock_checks(example.project.clusters["b300"], fixed)[0].ok


def test_multi_node_rdma_training_checks_locked_memory_first(example: LoadedProject) -> None:
    plan = resolve(example, PlanRequest("train", "b300"))
    job = next(o.values for o in plan.objects if o.template == "job-train")
    assert example.project.clusters["b300"].network.rdma_resource
    first = job["init_containers"][0]
    assert first["name"] == "memlock-check"
    assert first["command"] == ["python", "-m", "kimideploy.workloads.memlock_check"]
    # The same user and capabilities as the process that will run NCCL.
    assert first["securityContext"] == job["security_context"]
    assert "locked memory" in dict(plan.facts)
    single = resolve(example, PlanRequest("train", "rtx6000"))
    job = next(o.values for o in single.objects if o.template == "job-train")
    assert all(c["name"] != "memlock-check" for c in job["init_containers"])
