"""The all-reduce probe `host check --allreduce` runs: one node's GPUs, the serve image, the serve
pod's NCCL settings, the GPU check's all-reduce against network.min_node_bus_gbps.

It is the serve pod's own first collective, run on its own: seconds instead of a 25-minute load
to learn that peer-to-peer is blocked (a hang, named after the timeout) or slow (the figure
against the threshold). It needs the node's GPUs free: on the single PCIe host, before `up` or
after `down`; a pod the scheduler cannot place is reported as such, not waited for.
"""

from __future__ import annotations

import shlex

from kimideploy.plan import pods
from kimideploy.plan.inputs import PlanInputs
from kimideploy.plan.model import ObjectPlan

PROBE_CONTAINER = "probe"
"""The container job-probe.yaml.j2 names (the weights probe's too)."""
ALLREDUCE_TIMEOUT_S = 120
"""Inside the pod: NCCL's set-up and 11 all-reduces of 256 MiB take seconds; a hang is named."""
TOPOLOGY_ENV = "KIMIDEPLOY_NCCL_TOPOLOGY"
TOPOLOGY_PATH = "/tmp/nccl-topology.xml"
RESULT_PREFIX = "gpu-check: "


def allreduce_job(ctx: PlanInputs) -> ObjectPlan:
    """The probe Job of a serve plan: `host check --allreduce` applies, follows, deletes it."""
    gpus = ctx.cluster.gpu.per_node
    serve = ctx.cluster.workloads.serve
    check = pods.gpu_check_command(ctx, ["allreduce"], ALLREDUCE_TIMEOUT_S)
    extra: dict[str, str] = {}
    script = f"exec {shlex.join(check)}"
    topology = ctx.cluster.network.nccl_topology
    if topology:
        # No spec ConfigMap travels with a probe: the pod writes the topology where NCCL reads it.
        extra = {TOPOLOGY_ENV: topology, "NCCL_TOPO_FILE": TOPOLOGY_PATH}
        script = f'printf "%s" "${TOPOLOGY_ENV}" > {TOPOLOGY_PATH} && {script}'
    shm_volume, shm_mount = pods.shm_volume(serve.shm_size)
    writable_volumes, writable_mounts = pods.writable_volumes()
    return pods.probe_job(
        ctx,
        component="allreduce-probe",
        fail_at_once={"containerName": PROBE_CONTAINER, "operator": "NotIn", "values": [0]},
        pod_annotations=serve.pod_annotations,
        container={
            "node_selector": pods.node_selector(ctx, gpus),
            "image": ctx.image.reference,
            "command": ["sh", "-c", script],
            "args": [],
            "env": pods.env(ctx, gpus, extra),
            "resources": pods.resources("4", "16Gi", gpus),
            "volumes": [shm_volume, *writable_volumes],
            "volume_mounts": [shm_mount, *writable_mounts],
        },
    )
