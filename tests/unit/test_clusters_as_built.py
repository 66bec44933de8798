"""The rented clusters and the PCIe host as they are built: datagen sized to what serve holds,
weights brought to the volume the pods mount, NCCL over the compute HCAs, host checks that read
the right devices."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.loading import LoadedProject, load_project
from kimideploy.errors import ConfigError
from kimideploy.plan.model import Plan, PlanRequest
from kimideploy.plan.resolve import resolve


def spec_of(plan: Plan) -> dict[str, Any]:
    config = next(o.values for o in plan.objects if o.template == "configmap-spec")
    result: dict[str, Any] = json.loads(config["data"]["spec.json"])
    return result


@pytest.mark.parametrize(("cluster", "per_shard"), [("rtx6000", 32), ("b200", 16), ("b300", 4)])
def test_datagen_asks_no_more_than_the_serve_release_holds(
    example: LoadedProject, cluster: str, per_shard: int
) -> None:
    """replicas x max_num_seqs shared over the shards: b300's 64 shards x 64 streams were 4,096
    requests against 256 sequences, and the tail timed out in vLLM's queue."""
    spec = spec_of(resolve(example, PlanRequest("datagen", cluster)))
    assert spec["concurrency"] == per_shard
    serve = example.project.clusters[cluster].workloads
    assert per_shard * serve.datagen.shards <= serve.serve.replicas * serve.serve.max_num_seqs


def test_more_datagen_streams_than_serve_holds_is_refused_with_the_numbers(
    example: LoadedProject,
) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve(example, PlanRequest("datagen", "b300", overrides=("datagen.concurrency=64",)))
    assert caught.value.message == (
        "clusters.b300.workloads.datagen.concurrency: 64 shards x 64 = 4096 requests in flight, "
        "but the serve release holds 256 at once (2 replicas x max_num_seqs 128); the rest would "
        "wait in vLLM's queue and time out"
    )
    assert "leave datagen.concurrency unset (it is then 4)" in (caught.value.hint or "")
    other = ("datagen.endpoint=http://vllm.example:8000", "datagen.concurrency=64")
    assert (
        spec_of(resolve(example, PlanRequest("datagen", "b300", overrides=other)))["concurrency"]
        == 64
    )  # an endpoint kimideploy does not size is the user's to size


def job_of(plan: Plan) -> dict[str, Any]:
    return next(o.values for o in plan.objects if o.template.startswith("job-"))


def test_multi_node_trainers_reach_the_fabric_through_the_compute_hcas_only(
    example: LoadedProject,
) -> None:
    """Without an RDMA device, IPC_LOCK and the verbs library NCCL falls back to TCP over the pod
    network without a word; `NCCL_IB_HCA=mlx5` also matched front-end and storage NICs."""
    plan = resolve(example, PlanRequest("train", "b200"))  # two nodes
    job = job_of(plan)
    env = {e["name"]: e.get("value") for e in job["env"]}
    assert env["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{i}" for i in range(8))
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_FILE"] == "/tmp/nccl.%h.%p.log"
    assert job["resources"]["limits"]["rdma/rdma_shared_device_a"] == "1"
    assert job["security_context"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert spec_of(plan)["network_check"] == {"min_bus_gbps": 100.0, "bytes": 256 * 2**20}
    single = job_of(resolve(example, PlanRequest("train", "rtx6000")))
    assert single["security_context"]["capabilities"] == {"drop": ["ALL"]}
    assert "network_check" not in spec_of(resolve(example, PlanRequest("train", "rtx6000"))) or (
        spec_of(resolve(example, PlanRequest("train", "rtx6000")))["network_check"] is None
    )


def first_cluster_edited(tmp_path: Path, old: str, new: str) -> Path:
    """The example with `old` replaced in its first cluster that has it (b200 before b300)."""
    from tests.conftest import EXAMPLE

    path = tmp_path / "kimideploy.yaml"
    path.write_text(EXAMPLE.read_text().replace(old, new, 1))
    return path


def test_host_networking_and_sriov_attachments_are_rendered_when_chosen(tmp_path: Path) -> None:
    from kimideploy.render.manifests import render

    loaded = load_project(first_cluster_edited(
        tmp_path, "      socket_ifname: eth0\n",
        "      socket_ifname: eth0\n      host_network: true\n"
        "      network_attachments: [kimi/ib-sriov]\n",
    ))  # fmt: skip
    manifests = render(resolve(loaded, PlanRequest("train", "b200")))
    [job] = [m for m in manifests if m["kind"] == "Job"]
    pod = job["spec"]["template"]
    assert pod["spec"]["hostNetwork"] is True
    assert pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "kimi/ib-sriov"


def test_an_hca_prefix_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_project(first_cluster_edited(tmp_path, '      NCCL_NVLS_ENABLE: "1"\n',
                                          '      NCCL_NVLS_ENABLE: "1"\n      NCCL_IB_HCA: mlx5\n'))  # fmt: skip
    assert "env.NCCL_IB_HCA: 'mlx5' is a prefix: it also matches front-end and storage NICs" in (
        caught.value.message
    )
    assert "network.ib_hcas" in caught.value.message


@pytest.mark.parametrize(
    ("transports", "bus", "minimum", "words"),
    [
        (["IB", "Socket"], 300.0, 100.0, "over TCP sockets, not InfiniBand (rank 1)"),
        (["IB", "IB"], 40.0, 100.0, "reached 40.0 GB/s bus bandwidth, below network.min_bus_gbps 100"),
        (["IB", "IB"], 300.0, 100.0, None),
        ([None, None], 5.0, None, None),  # no threshold set, no NCCL log: nothing to judge
    ],
)  # fmt: skip
def test_the_pre_training_allreduce_verdict(
    transports: list[str | None], bus: float, minimum: float | None, words: str | None
) -> None:
    from kimideploy.workloads.allreduce_probe import verdict

    found = verdict(transports, bus, minimum)
    assert (found is None) if words is None else (found is not None and words in found)
