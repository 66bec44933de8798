"""`kimideploy plan requirements`: what a cluster needs, made from the plans `up` and `run` make,
and the getting-started guide's tables, which are this command's output for the example."""

from __future__ import annotations

from kimideploy.cli.main import main
from kimideploy.config.loading import LoadedProject
from kimideploy.services.requirements import (
    REQUIREMENTS_BEGIN,
    REQUIREMENTS_END,
    REQUIREMENTS_PAGE,
    markdown,
    requirements,
)
from tests.conftest import REPO


def test_the_guide_carries_the_generated_tables(example: LoadedProject) -> None:
    page = (REPO / REQUIREMENTS_PAGE).read_text()
    shown = page.split(REQUIREMENTS_BEGIN, 1)[1].split(REQUIREMENTS_END, 1)[0]
    assert shown.strip() == markdown(example).strip(), (
        "the guide's requirements are stale: run scripts/update-golden"
    )


def test_the_pcie_hosts_needs_are_what_its_plans_take(example: LoadedProject) -> None:
    found = {r.what: r for r in requirements(example, "rtx6000")}
    assert found["NVIDIA driver"].need == ">= 580.65.06"  # CUDA 13.0's minimum
    # The serve pod's limit holds the checkpoint in the page cache (the page-cache plan).
    assert found["host RAM per GPU node"].need.startswith(">= 627Gi for the serve pod")
    assert found["claim kimi-k25-models"].need == "2Ti of StorageClass local-path (ReadWriteOnce)"
    # The claims add up to about 4 TiB of the host's NVMe.
    assert found["storage in all"].need == "4.0 TiB of local-path"
    assert "RDMA" not in found  # one node, no InfiniBand between nodes
    rented = {r.what for r in requirements(example, "b300")}
    assert "RDMA" in rented


def test_the_command_prints_them(capsys: object) -> None:
    assert main(["plan", "requirements", "--cluster", "b300", "-o", "json"]) == 0
