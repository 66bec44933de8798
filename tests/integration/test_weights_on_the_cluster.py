"""The weights as the pods see them, and one node's all-reduce, on the control plane.

- `up` on a rented cluster runs the weights probe (the models claim mounted read-only, each
  completion marker tested) before anything is applied; a missing marker or claim is a refusal.
- `host sync-model` there is the download Job into the claim, followed to its result.
- `host check` reads the claim from a pod (not the node's disk over SSH) and, with --allreduce,
  runs the serve pod's first collective on one node's GPUs.
KWOK completes the probe pods as kubelets would; a failing index and its log stand for a missing
marker or a slow all-reduce, so what is tested is kimideploy's Jobs, claims and readings.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import harness, weights_synced
from tests.integration.gpu_machine import Machine, install
from tests.integration.sshd import start_sshd

pytestmark = pytest.mark.integration
Kd = Callable[..., tuple[int, str, str]]
MARKER_PATH = "/models/hub/moonshotai/Kimi-K2.5"
RTX = Machine(name="NVIDIA RTX PRO 6000 Blackwell Server Edition", compute_cap="12.0",
              memory_mib=97887, bar1_mib=131072, link="PIX", k3s_node="gpu-host True 8")  # fmt: skip


def hooks(workload: str, **values: str) -> str:
    return f"{workload}.pod_annotations=" + json.dumps(
        {f"kimideploy.test/{k.replace('_', '-')}": v for k, v in values.items()}
    )


@pytest.fixture
def machine_hosts(
    edited_config: Callable[..., Path], tmp_path: Path
) -> Iterator[Callable[[Machine], Path]]:
    """The example whose gpu-host and b300-0 are an sshd in front of a GPU machine's tools."""
    servers: list[Any] = []

    def make(machine: Machine) -> Path:
        server = start_sshd(tmp_path / "sshd", install(tmp_path / "machine", machine))
        servers.append(server)
        models = tmp_path / "nvme" / "models"  # the host's weights, synced earlier
        marker = (
            models / "hub" / "moonshotai" / "Kimi-K2.5" / "3d2f1c0b9a8e" / ".kimideploy-complete"
        )
        marker.parent.mkdir(parents=True)
        marker.write_text("{}\n")
        line = (f"{{address: 127.0.0.1, port: {server.port}, user: {server.user}, "
                f"identity_file: {server.user_key}, known_hosts: {server.known_hosts}}}")  # fmt: skip
        return edited_config(
            ("      - {name: gpu-host, address: 192.0.2.10, user: ops}   # EXAMPLE: your host's address",
             "      - {name: gpu-host, " + line[1:]),
            ("      - {name: b300-0, address: 198.51.100.30, user: ubuntu}",
             "      - {name: b300-0, " + line[1:]),
            ("      - {name: b300-1, address: 198.51.100.31, user: ubuntu}\n", ""),
            ("      model_path: /mnt/nvme/models ", f"      model_path: {models} "),
        )  # fmt: skip

    yield make
    for server in servers:
        server.stop()


def test_up_refuses_a_rented_cluster_whose_claim_has_no_weights(
    kd: Kd, testcluster: harness.TestCluster, namespace: str, tmp_path: Path
) -> None:
    code, _, err = kd("up", "serve", "--cluster", "b300", "--drafter", "none", "--poll", "0.3")
    assert code == 2, err
    assert "the models claim kimi-k25-models does not exist" in err
    assert "kimideploy host sync-model --cluster b300" in err
    weights_synced(testcluster, namespace)
    missing = f"missing {MARKER_PATH}/3d2f1c0b9a8e/.kimideploy-complete"
    harness.serve_logs(
        testcluster, namespace, harness.write_container_log(tmp_path / "p.log", [missing])
    )
    code, _, err = kd("up", "serve", "--cluster", "b300", "--drafter", "none", "--poll", "0.3",
                      "--yes", "--set", hooks("weights", fail_index="0", run_duration="1s"))  # fmt: skip
    assert code == 2, err
    assert "the models volume, as the pods mount it, has no " + missing.split(" ", 1)[1] in err
    # Nothing of the release was applied, and the probe Job is gone.
    assert testcluster.kubectl("-n", namespace, "get", "deploy,jobs", "-o", "name").strip() == ""


def test_host_sync_model_fills_the_shared_claim_with_a_download_job(
    kd: Kd, testcluster: harness.TestCluster, namespace: str, tmp_path: Path
) -> None:
    weights_synced(testcluster, namespace)
    code, _, err = kd("host", "sync-model", "--cluster", "b300", "--no-drafters", "--poll", "0.3")
    assert code == 2 and "Secret hf-token (model.hf_token) does not exist" in err
    testcluster.kubectl("-n", namespace, "create", "secret", "generic", "hf-token",
                        "--from-literal=token=hf_test_token")  # fmt: skip
    result = {"event": "result", "stage": "weights", "synced": [{
        "repo": "moonshotai/Kimi-K2.5", "revision": "3d2f1c0b9a8e" + "0" * 28,
        "dest": f"{MARKER_PATH}/3d2f1c0b9a8e"}]}  # fmt: skip
    harness.serve_logs(testcluster, namespace,
                       harness.write_container_log(tmp_path / "w.log", [json.dumps(result)]))  # fmt: skip
    code, _, err = kd("host", "sync-model", "--cluster", "b300", "--no-drafters", "--poll", "0.3")
    assert code == 0, err
    assert f"moonshotai/Kimi-K2.5@3d2f1c0b9a8e verified in {MARKER_PATH}/3d2f1c0b9a8e" in err


def test_host_check_reads_the_weights_from_the_claim_not_the_node(
    kd: Kd,
    testcluster: harness.TestCluster,
    namespace: str,
    machine_hosts: Callable[[Machine], Path],
    tmp_path: Path,
) -> None:
    compute = {f"mlx5_{i}": ("ACTIVE", "InfiniBand") for i in range(8)}
    config = machine_hosts(Machine(ib_ports=compute))
    code, out, err = kd(
        "host", "check", "--cluster", "b300", "-o", "json", "--poll", "0.3", config=config
    )
    rows = {r["check"]: r for r in json.loads(out)}
    assert code == 1 and rows["weights on the models claim"]["status"] == "FAIL", (err, rows)
    assert "does not exist" in rows["weights on the models claim"]["detail"]
    assert rows["weights on the models claim"]["host"] == "cluster b300"
    assert "free space" not in rows and "model on disk" not in rows  # the node's disk is not it
    weights_synced(testcluster, namespace)
    code, out, err = kd(
        "host", "check", "--cluster", "b300", "-o", "json", "--poll", "0.3", config=config
    )
    rows = {r["check"]: r for r in json.loads(out)}
    assert code == 0, (err, [r for r in rows.values() if r["status"] != "pass"])
    assert rows["weights on the models claim"]["status"] == "pass"


def test_host_check_measures_the_models_claim_and_the_next_plan_reads_it(
    kd: Kd,
    testcluster: harness.TestCluster,
    namespace: str,
    machine_hosts: Callable[[Machine], Path],
    tmp_path: Path,
) -> None:
    """`host check --storage`: the storage probe Job reads the claim cold; its pod's output here
    is the real reader's (workloads/page_cache.py probe on a local checkpoint), its figure is
    recorded on the cluster, and the next plan's reader line quotes it."""
    import subprocess
    import sys

    from tests.conftest import REPO

    config = machine_hosts(
        Machine(ib_ports={f"mlx5_{i}": ("ACTIVE", "InfiniBand") for i in range(8)})
    )
    weights_synced(testcluster, namespace)
    model = tmp_path / "model"
    model.mkdir()
    for index in range(3):
        (model / f"model-{index}.safetensors").write_bytes(os.urandom(8 << 20))
    probe = subprocess.run([sys.executable, "-m", "kimideploy.workloads.page_cache", "probe",
                            str(model), "--sample-gb", "0.01"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(REPO / "src")}, check=True)  # fmt: skip
    result = json.loads(probe.stdout.splitlines()[-1])
    log = harness.write_container_log(tmp_path / "probe.log", probe.stdout.splitlines())
    selector = "app.kubernetes.io/component=storage-probe"
    with harness.PodHooks(testcluster, namespace, selector, lambda pod: (log, {})):
        code, out, err = kd("host", "check", "--cluster", "b300", "--storage", "-o", "json",
                            "--poll", "0.3", config=config)  # fmt: skip
    rows = {r["check"]: r for r in json.loads(out)}
    row = rows["models read bandwidth"]
    assert row["detail"].startswith(f"{result['gbps']:.2f} GB/s cold"), row
    assert row["host"] == "cluster b300"
    from kimideploy.cluster.measurements import config_map_name

    stored = json.loads(testcluster.kubectl("-n", namespace, "get", "configmap",
                                            config_map_name("b300", "storage"), "-o", "json"))  # fmt: skip
    assert f'"gbps": {result["gbps"]}' in json.dumps(stored["data"]).replace('\\"', '"')
    code, _, err = kd("up", "serve", "--cluster", "b300", "--drafter", "none", "--dry-run",
                      "server", config=config)  # fmt: skip
    assert code == 0, err
    assert f"measured {result['gbps']:.1f} GB/s" in err, err


ALLREDUCE_OK = ("gpu-check: ok   allreduce: NCCL all-reduce over 8 GPUs: 27.3 GB/s bus bandwidth "
                "(256 MiB in 17.2 ms)")  # fmt: skip
ALLREDUCE_SLOW = ("gpu-check: FAIL allreduce: SlowAllReduceError: NCCL all-reduce over 8 GPUs: 9.1 "
                  "GB/s bus bandwidth (256 MiB in 51.6 ms), below network.min_node_bus_gbps 20: "
                  "peer-to-peer between the GPUs is off or crosses the CPU")  # fmt: skip


def allreduce_check(
    kd: Kd, config: Path, *set_hooks: str
) -> tuple[int, dict[str, dict[str, str]], str]:
    """`host check --allreduce` on the PCIe host; its rows by check, with its exit and stderr."""
    extra = [arg for hook in set_hooks for arg in ("--set", hook)]
    code, out, err = kd("host", "check", "--cluster", "rtx6000", "--allreduce", "-o", "json",
                        "--poll", "0.3", *extra, config=config)  # fmt: skip
    return code, {r["check"]: r for r in json.loads(out)}, err


def test_host_check_runs_one_nodes_all_reduce_against_the_threshold(
    kd: Kd,
    testcluster: harness.TestCluster,
    namespace: str,
    machine_hosts: Callable[[Machine], Path],
    tmp_path: Path,
) -> None:
    log = harness.write_container_log(tmp_path / "ok.log", ["gpu-check: GPUs suit", ALLREDUCE_OK])
    harness.serve_logs(testcluster, namespace, log)
    code, rows, err = allreduce_check(kd, machine_hosts(RTX), hooks("serve", run_duration="1s"))
    assert code == 0, err
    assert rows["all-reduce on one node"]["detail"].startswith("NCCL all-reduce over 8 GPUs: 27.3")
    assert testcluster.kubectl("-n", namespace, "get", "jobs", "-o", "name").strip() == ""


def test_a_slow_all_reduce_fails_the_host_check(
    kd: Kd,
    testcluster: harness.TestCluster,
    namespace: str,
    machine_hosts: Callable[[Machine], Path],
    tmp_path: Path,
) -> None:
    log = harness.write_container_log(tmp_path / "slow.log", [ALLREDUCE_SLOW])
    harness.serve_logs(testcluster, namespace, log)
    code, rows, _ = allreduce_check(
        kd, machine_hosts(RTX), hooks("serve", fail_index="0", run_duration="1s")
    )
    assert code == 1
    assert rows["all-reduce on one node"]["status"] == "FAIL"
    assert "below network.min_node_bus_gbps 20" in rows["all-reduce on one node"]["detail"]


def test_the_probe_says_when_serve_holds_the_gpus(
    kd: Kd,
    testcluster: harness.TestCluster,
    namespace: str,
    machine_hosts: Callable[[Machine], Path],
) -> None:
    config = machine_hosts(RTX)
    code, _, err = kd("up", "serve", "--cluster", "rtx6000", "--drafter", "none", "--poll", "0.3",
                      "--yes")  # fmt: skip
    assert code == 0, err
    code, rows, _ = allreduce_check(kd, config)
    row = rows["all-reduce on one node"]
    assert code == 1 and row["status"] == "FAIL"
    assert "unschedulable" in row["detail"] and "nvidia.com/gpu" in row["detail"]
    assert "run it before `up`, or after `down`" in row["fix"]
