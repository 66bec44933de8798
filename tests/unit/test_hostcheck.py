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
                           "container runtime", "k3s", "allocatable nvidia.com/gpu", "device plugin",
                           "IOMMU", "nvidia_uvm HMM", "PCIe ACS", "BAR1", "GPU topology",
                           "GPU peer-to-peer"}  # fmt: skip
    assert checks["IOMMU"].detail == "kernel has iommu=pt"
    assert checks["GPU topology"].detail == (
        "8 NODE, 4 PIX, 16 SYS GPU pairs; 16 pairs across the CPUs' interconnect: peer-to-peer "
        "there needs NCCL_P2P_LEVEL=SYS, and each ring step that crosses is bounded by the CPU link"
    )
    assert checks["GPU peer-to-peer"].detail == "peer reads supported between all 28 pairs"
    assert checks["BAR1"].detail == "covers each GPU's memory (131072 MiB)"


def test_a_broken_rtx6000_host_reports_each_problem_with_its_fix(example: LoadedProject) -> None:
    checks = run(example, "rtx6000", "rtx6000-broken.txt")
    failing = {name: c for name, c in checks.items() if not c.ok}
    assert set(failing) == {
        "GPU count", "driver", "CUDA", "driver pin", "persistence mode", "ECC", "clocks",
        "free space", "container runtime", "allocatable nvidia.com/gpu", "device plugin",
        "IOMMU", "nvidia_uvm HMM", "PCIe ACS", "BAR1", "GPU peer-to-peer",
    }  # fmt: skip
    # What blocks peer-to-peer blocks the deploy (hangs, or no window to map); the rest warns.
    assert {n for n, c in failing.items() if c.blocking} >= {"PCIe ACS", "BAR1"}
    assert not failing["IOMMU"].blocking and not failing["nvidia_uvm HMM"].blocking
    assert failing["IOMMU"].detail == "kernel has none; host_setup.peer_to_peer wants iommu=pt"
    assert failing["PCIe ACS"].detail == "redirection on at 3 bridges (00:01.1, 20:01.1, 60:03.1)"
    assert failing["BAR1"].detail.startswith("00000000:18:00.0 (256 MiB BAR1, 97887 MiB memory)")
    assert "Resizable BAR" in failing["BAR1"].fix
    assert failing["GPU peer-to-peer"].detail.startswith(
        "4 of 28 pairs not supported: GPU0-GPU4 chipset not supported"
    )
    assert failing["GPU count"].detail == "7 GPUs (profile: 8)"
    assert failing["driver"].detail == "570.172.08 (CUDA 13.0 in the image needs >= 580.65.06)"
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


def test_a_ready_b200_node_with_down_front_end_and_storage_nics(example: LoadedProject) -> None:
    """mlx5_9 (Ethernet) and mlx5_10 (a storage HCA) are down on this healthy node: only the
    compute HCAs network.ib_hcas names are NCCL's, and only they are checked."""
    checks = run(example, "b200", "b200-ready.txt")
    assert checks["InfiniBand"].ok and checks["InfiniBand"].detail == (
        "8/8 compute HCA ports ACTIVE"
    )
    assert checks["GPU fabric registration"].detail == "8 GPUs Completed/Success"
    assert checks["GPU topology"].detail.startswith("28 NV18 GPU pairs; every pair over NVLink")


def test_b300_fabric_and_infiniband_problems(example: LoadedProject) -> None:
    checks = run(example, "b300", "b300-fabric-down.txt")
    assert not checks["fabric manager"].ok and checks["fabric manager"].detail == "failed"
    # The fabric manager's state says nothing of each GPU's registration: both are read.
    registration = checks["GPU fabric registration"]
    assert not registration.ok and registration.blocking
    assert registration.detail == (
        "00000000:AB:00.0 In Progress/N/A; 00000000:BA:00.0 Completed/Insufficient Resources"
    )
    assert checks["InfiniBand"].detail == "mlx5_2/1 DOWN" and checks["InfiniBand"].blocking
    assert not checks["nvidia_peermem"].ok and not checks["nvidia_peermem"].blocking
    # The pods mount the shared models claim, not this node's disk: `host check` reads the
    # weights from a pod on the cluster (tests/integration), never the node-local marker.
    assert "model on disk" not in checks and "free space" not in checks


@pytest.mark.parametrize("cluster", ["rtx6000", "b300"])
def test_no_driver(example: LoadedProject, cluster: str) -> None:
    checks = run(example, cluster, "no-driver.txt")
    assert not checks["nvidia-smi"].ok and "nvidia-smi: not found" in checks["nvidia-smi"].detail
    assert "install the driver" in checks["nvidia-smi"].fix


def test_an_hca_the_node_does_not_have_is_named(example: LoadedProject) -> None:
    project = example.project
    fixture = (FIXTURES / "b200-ready.txt").read_text()

    def with_hcas(hcas: list[str]) -> dict[str, CheckResult]:
        base = project.clusters["b200"]
        profile = base.model_copy(
            update={"network": base.network.model_copy(update={"ib_hcas": hcas})}
        )
        return {
            c.name: c
            for c in evaluate(project, profile, project.images[base.images.serve], fixture)
        }

    found = with_hcas(["mlx5_0", "mlx5_1:1", "mlx5_12"])
    assert found["InfiniBand"].detail == "mlx5_12 not on this node"
    assert "ibstat -l" in found["InfiniBand"].fix
    # Unnamed: every InfiniBand-link port counts (the down storage HCA too), and a warning says why.
    found = with_hcas([])
    assert found["InfiniBand"].detail == "mlx5_10/1 DOWN"
    assert not found["compute HCAs named"].ok and not found["compute HCAs named"].blocking
