"""The serve start's host side (plan/page_cache.py): whether a restart can find the checkpoint in
the page cache, what the plan does about it, which reader vLLM gets for the storage, the
node-local copy of a slow shared filesystem, and the CUDA-graph capture size. The reader itself
(workloads/page_cache.py) is at the end; its figures on a real engine are bench/start_up.py's."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.clusters import NodeLocal
from kimideploy.config.loading import LoadedProject
from kimideploy.config.workloads import PodResources
from kimideploy.plan.model import ClusterAnswers, PlanRequest
from kimideploy.plan.resolve import resolve
from kimideploy.services.rendering import render_workload


def with_cluster(example: LoadedProject, name: str, **changes: Any) -> LoadedProject:
    """The example with cluster `name` changed: `serve` and `load` keys go to the serve
    settings and their load settings, the rest to the cluster profile."""
    clusters = dict(example.project.clusters)
    cluster = clusters[name]
    serve = cluster.workloads.serve
    load = serve.load.model_copy(update=changes.pop("load", {}))
    serve = serve.model_copy(update={**changes.pop("serve", {}), "load": load})
    workloads = cluster.workloads.model_copy(update={"serve": serve})
    clusters[name] = cluster.model_copy(update={"workloads": workloads, **changes})
    return replace(example, project=example.project.model_copy(update={"clusters": clusters}))


def facts(
    loaded: LoadedProject, cluster: str, answers: ClusterAnswers | None = None
) -> dict[str, str]:
    plan = resolve(loaded, PlanRequest("serve", cluster, "v3"), answers or ClusterAnswers())
    return dict(plan.facts)


def deployment(
    loaded: LoadedProject, cluster: str, answers: ClusterAnswers | None = None
) -> dict[str, Any]:
    rendered = render_workload(
        loaded, PlanRequest("serve", cluster, "v3"), answers or ClusterAnswers()
    )
    return next(o for o in rendered.objects if o["kind"] == "Deployment")


def serve_container(obj: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = obj["spec"]["template"]["spec"]["containers"][0]
    return container


def arg(container: dict[str, Any], flag: str) -> str | None:
    args = container["args"]
    return args[args.index(flag) + 1] if flag in args else None


def test_the_pcie_hosts_limit_is_raised_to_hold_the_checkpoint_where_the_node_has_the_ram(
    example: LoadedProject,
) -> None:
    found = facts(example, "rtx6000")
    assert found["page cache"] == (
        "the serve container's memory limit is raised from 384Gi to 627Gi so its page cache "
        "holds the checkpoint (595 GB) across restarts (the node has 1024 GB)"
    )
    container = serve_container(deployment(example, "rtx6000"))
    # The limit, not the request: the page cache may grow into it, nothing is reserved for it.
    assert container["resources"]["limits"]["memory"] == "627Gi"
    assert container["resources"]["requests"]["memory"] == "384Gi"
    assert arg(container, "--safetensors-load-strategy") == "prefetch"
    assert arg(container, "--safetensors-prefetch-num-threads") == "4"


def test_an_engine_without_the_prefetch_reader_maps_lazily_and_gets_no_threads_flag(
    example: LoadedProject,
) -> None:
    # vLLM 0.16 rejects --safetensors-prefetch-num-threads (tests/images); the page cache still
    # holds the checkpoint, read lazily.
    cluster = example.project.clusters["rtx6000"]
    images = cluster.images.model_copy(update={"serve": "vllm-0.16-kimi"})
    older = with_cluster(example, "rtx6000", images=images)
    container = serve_container(deployment(older, "rtx6000"))
    assert arg(container, "--safetensors-load-strategy") == "lazy"
    assert "--safetensors-prefetch-num-threads" not in container["args"]
    assert container["resources"]["limits"]["memory"] == "627Gi"
    assert facts(older, "rtx6000")["weights reader"].startswith(
        "lazy: vLLM 0.16.0 has no prefetch strategy (vLLM 0.32 has)"
    )


def test_a_node_without_the_ram_is_a_warning_with_the_numbers_and_a_lazy_reader(
    example: LoadedProject,
) -> None:
    small = with_cluster(example, "rtx6000", node_memory_gb=512)
    plan = resolve(small, PlanRequest("serve", "rtx6000", "v3"))
    found = dict(plan.facts)
    assert found["page cache"].startswith("no restart can be warm: the checkpoint (595 GB)")
    assert "node's 512 GB RAM" in found["page cache"]
    assert any("every restart reads the storage again" in w for w in plan.warnings)
    container = serve_container(deployment(small, "rtx6000"))
    assert arg(container, "--safetensors-load-strategy") == "lazy"
    assert container["resources"]["limits"]["memory"] == "384Gi"
    unknown = with_cluster(example, "rtx6000", node_memory_gb=None)
    assert "the node's RAM is unknown" in facts(unknown, "rtx6000")["page cache"]


def test_a_warmer_keeps_the_limit_and_reads_the_checkpoint_on_every_gpu_node_first(
    example: LoadedProject,
) -> None:
    warmer = with_cluster(example, "rtx6000", load={"page_cache": "warmer"})
    plan = resolve(warmer, PlanRequest("serve", "rtx6000", "v3"))
    assert dict(plan.facts)["page cache"].startswith("a page-cache warmer Job reads the checkpoint")
    rendered = render_workload(warmer, PlanRequest("serve", "rtx6000", "v3"))
    warm = [p for p in rendered.preflight if p["metadata"]["name"].endswith("page-cache-warmer")]
    assert len(warm) == 1
    pod = warm[0]["spec"]["template"]["spec"]
    reader = pod["containers"][0]
    assert reader["command"][:4] == ["python", "-m", "kimideploy.workloads.page_cache", "warm"]
    assert reader["resources"]["limits"]["memory"] == "559Gi"  # the checkpoint and 4Gi
    assert reader["resources"]["requests"]["memory"] == "1Gi"
    assert pod["nodeSelector"]["nvidia.com/gpu.product"].startswith("NVIDIA-RTX-PRO-6000")
    assert warm[0]["spec"]["completions"] == 1 and "affinity" not in pod  # one node
    assert (
        serve_container(deployment(warmer, "rtx6000"))["resources"]["limits"]["memory"] == "384Gi"
    )
    # On a multi-node cluster, one reader per node, kept apart.
    b300 = with_cluster(example, "b300", serve={"resources": PodResources(cpu="96", memory="512Gi")},
                        load={"page_cache": "warmer"})  # fmt: skip
    rendered = render_workload(b300, PlanRequest("serve", "b300", "v3"))
    warm = [p for p in rendered.preflight if p["metadata"]["name"].endswith("page-cache-warmer")]
    spec = warm[0]["spec"]
    assert spec["completions"] == spec["parallelism"] == 8
    terms = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert terms["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"] == (
        "kubernetes.io/hostname"
    )


def test_a_slow_shared_filesystem_is_served_from_a_copy_on_each_nodes_nvme(
    example: LoadedProject,
) -> None:
    node_local = NodeLocal(path="/raid/kimideploy", size_gb=3000)
    storage = example.project.clusters["b300"].storage.model_copy(update={"node_local": node_local})
    local = with_cluster(example, "b300", storage=storage)
    plan = resolve(local, PlanRequest("serve", "b300", "v3"))
    assert plan.measure_storage_first  # nothing measured yet: `up` probes, then plans again
    slow = ClusterAnswers(storage_read_gbps=0.4)
    found = facts(local, "b300", slow)
    assert "node-local NVMe (a copy), measured 0.4 GB/s" in found["weights reader"]
    container = serve_container(deployment(local, "b300", slow))
    assert container["command"][2].startswith("/node-local/hub/moonshotai/Kimi-K2.5/")
    assert {"name": "node-local", "mountPath": "/node-local", "readOnly": True} in (
        container["volumeMounts"]
    )
    rendered = render_workload(local, PlanRequest("serve", "b300", "v3"), slow)
    copy = next(p for p in rendered.preflight if p["metadata"]["name"].endswith("local-copy"))
    command = copy["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[3:5] == [
        "copy",
        "/models/hub/moonshotai/Kimi-K2.5/" + command[4].rsplit("/", 1)[1],
    ]
    assert command[command.index("--to") + 1] == container["command"][2]
    volumes = {v["name"]: v for v in copy["spec"]["template"]["spec"]["volumes"]}
    assert volumes["node-local"]["hostPath"] == {"path": "/raid/kimideploy",
                                                 "type": "DirectoryOrCreate"}  # fmt: skip
    # Fast enough: served from the claim, no copy.
    fast = ClusterAnswers(storage_read_gbps=6.5)
    assert "a shared filesystem, measured 6.5 GB/s" in facts(local, "b300", fast)["weights reader"]
    rendered = render_workload(local, PlanRequest("serve", "b300", "v3"), fast)
    assert not any(p["metadata"]["name"].endswith("local-copy") for p in rendered.preflight)


def test_the_capture_size_is_set_only_where_vllms_default_cannot_cover_the_widest_step(
    example: LoadedProject,
) -> None:
    assert (
        arg(serve_container(deployment(example, "rtx6000")), "--max-cudagraph-capture-size") is None
    )
    assert facts(example, "rtx6000")["CUDA graphs"].startswith("vLLM's default (up to 512 tokens")
    wide = with_cluster(example, "rtx6000", serve={"max_num_seqs": 256})
    container = serve_container(deployment(wide, "rtx6000"))
    assert arg(container, "--max-cudagraph-capture-size") == "1024"  # 256 requests x (1 + 3)
    # On the sm_100 family vLLM's default ceiling is 1024: the same batch is covered there.
    b300 = with_cluster(example, "b300", serve={"max_num_seqs": 256})
    assert arg(serve_container(deployment(b300, "b300")), "--max-cudagraph-capture-size") is None


def test_the_reader_warms_probes_cold_and_copies_resumably(tmp_path: Path) -> None:
    source = tmp_path / "model"
    (source / "sub").mkdir(parents=True)
    (source / "a.safetensors").write_bytes(b"a" * 3_000_000)
    (source / "sub" / "b.safetensors").write_bytes(b"b" * 1_000_000)
    (source / ".kimideploy-complete").write_text("done")

    def run(*args: str) -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-m", "kimideploy.workloads.page_cache", *args],
                              capture_output=True, text=True, check=True)  # fmt: skip
        result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
        return result

    warm = run("warm", str(source), "--threads", "2")
    assert (warm["stage"], warm["bytes"], warm["files"]) == ("warm", 4_000_000, 2)
    probe = run("probe", str(source), "--sample-gb", "0.001")
    assert probe["cold"] and probe["files"] == 1 and probe["gbps"] > 0
    copy = tmp_path / "local"
    assert run("copy", str(source), "--to", str(copy))["bytes"] == 4_000_000
    assert (copy / "sub" / "b.safetensors").read_bytes() == b"b" * 1_000_000
    assert (copy / ".kimideploy-complete").is_file()
    # A copy cut off: the whole file is kept, the partial one redone, the marker written last.
    (copy / ".kimideploy-complete").unlink()
    (copy / "sub" / "b.safetensors").write_bytes(b"b" * 10)
    again = run("copy", str(source), "--to", str(copy))
    assert again["bytes"] == 4_000_000 and (copy / ".kimideploy-complete").is_file()
    assert (copy / "sub" / "b.safetensors").read_bytes() == b"b" * 1_000_000
    missing = subprocess.run([sys.executable, "-m", "kimideploy.workloads.page_cache", "warm",
                              str(tmp_path / "nowhere")], capture_output=True, text=True)  # fmt: skip
    assert missing.returncode == 2 and "is not a folder" in missing.stderr


@pytest.mark.parametrize("strategy", ["lazy", "eager", "prefetch"])
def test_a_configured_strategy_is_honoured(example: LoadedProject, strategy: str) -> None:
    chosen = with_cluster(example, "rtx6000", load={"strategy": strategy})
    container = serve_container(deployment(chosen, "rtx6000"))
    assert arg(container, "--safetensors-load-strategy") == strategy
    assert facts(chosen, "rtx6000")["weights reader"].startswith(f"{strategy} as configured")
