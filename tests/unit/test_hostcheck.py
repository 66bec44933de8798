"""`host check` against probe outputs of each GPU model: each failing check names its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimideploy.config.loading import LoadedProject
from kimideploy.formats.check_result import CheckResult
from kimideploy.services.hosts.hostcheck import (
    evaluate,
    parse_cuda_version,
    parse_gpus,
    sections,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hostcheck"


def run(example: LoadedProject, cluster: str, fixture: str) -> dict[str, CheckResult]:
    project = example.project
    profile = project.clusters[cluster]
    image = project.images[profile.images.serve]
    checks = evaluate(project, profile, image, (FIXTURES / fixture).read_text())
    return {c.name: c for c in checks}


def test_parsers_read_the_nvidia_smi_formats() -> None:
    found = sections((FIXTURES / "rtx6000-ready.txt").read_text())
    gpus = parse_gpus(found["gpus"])
    assert gpus is not None and len(gpus) == 8
    assert gpus[0]["name"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert gpus[0]["compute_cap"] == "12.0" and gpus[0]["driver_version"] == "580.95.05"
    assert parse_cuda_version(found["banner"]) == "13.0"
    assert parse_gpus(sections((FIXTURES / "no-driver.txt").read_text())["gpus"]) is None


def test_a_ready_rtx6000_host_passes_everything(example: LoadedProject) -> None:
    checks = run(example, "rtx6000", "rtx6000-ready.txt")
    assert [c.name for c in checks.values() if not c.ok] == []
    assert set(checks) >= {"GPU count", "GPU model", "compute capability", "driver", "CUDA", "free space",
                           "container runtime", "k3s", "allocatable nvidia.com/gpu", "device plugin"}  # fmt: skip


def test_a_broken_rtx6000_host_reports_each_problem_with_its_fix(example: LoadedProject) -> None:
    checks = run(example, "rtx6000", "rtx6000-broken.txt")
    failing = {name: c for name, c in checks.items() if not c.ok}
    assert set(failing) == {
        "GPU count", "driver", "CUDA", "driver pin", "persistence mode", "ECC", "clocks",
        "free space", "container runtime", "allocatable nvidia.com/gpu", "device plugin",
    }  # fmt: skip
    assert failing["GPU count"].detail == "7 GPUs (profile: 8)"
    assert failing["driver"].detail == "570.172.08 (CUDA 12.9 in the image needs >= 575.51.03)"
    assert "upgrade the driver" in failing["driver"].fix
    assert failing["free space"].detail == "299 GB free on /mnt/nvme/models, need 654 GB"
    assert (
        failing["persistence mode"].detail == "off on GPUs 2"
        and not failing["persistence mode"].blocking
    )
    assert (
        failing["ECC"].detail == "disabled on GPUs 5"
        and failing["clocks"].detail == "throttled on GPUs 5"
    )
    assert all(c.fix for c in failing.values())


def test_the_sm120_vs_sm100_mistake_is_caught(example: LoadedProject) -> None:
    # A B200 host's output checked against the rtx6000 profile: wrong model and architecture.
    checks = run(example, "rtx6000", "b200-ready.txt")
    assert not checks["GPU model"].ok and not checks["compute capability"].ok
    assert (
        checks["compute capability"].detail
        == "sm_100 (profile sm_120; image sm_100, sm_103, sm_120)"
    )


def test_a_ready_b200_node(example: LoadedProject) -> None:
    checks = run(example, "b200", "b200-ready.txt")
    assert [c.name for c in checks.values() if not c.ok] == []
    assert "k3s" not in checks  # rented nodes: the provider runs Kubernetes


def test_b300_fabric_and_infiniband_problems(example: LoadedProject) -> None:
    checks = run(example, "b300", "b300-fabric-down.txt")
    assert not checks["fabric manager"].ok and checks["fabric manager"].detail == "failed"
    assert checks["InfiniBand"].detail == "7/8 ports ACTIVE" and checks["InfiniBand"].blocking
    assert not checks["nvidia_peermem"].ok and not checks["nvidia_peermem"].blocking
    assert checks["model on disk"].ok  # the marker replaces the free-space check


@pytest.mark.parametrize("cluster", ["rtx6000", "b300"])
def test_no_driver(example: LoadedProject, cluster: str) -> None:
    checks = run(example, cluster, "no-driver.txt")
    assert not checks["nvidia-smi"].ok and "nvidia-smi: not found" in checks["nvidia-smi"].detail
    assert "install the driver" in checks["nvidia-smi"].fix
