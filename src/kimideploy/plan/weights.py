"""Whether the weights are on the models volume as the pods will see it.

On a cluster whose pods mount a shared models claim (workloads.weights.via: job, the rented NVL8
clusters), `host check` over SSH sees each node's own disk, not the claim: the first `up` or `run`
found out at the serve pod's model check, after the GPUs were scheduled. So before a workload that
reads the weights is applied, a probe Job mounts the models claim read-only, exactly as the serve
pod does, and tests each completion marker the downloader writes last; a missing one is a refusal
naming the folder and the command that fills it.
"""

from __future__ import annotations

from kimideploy.config.drafters import Drafter
from kimideploy.plan import pods
from kimideploy.plan.inputs import PlanInputs, drafter_path, target_model_path
from kimideploy.plan.model import ObjectPlan

MARKER = ".kimideploy-complete"
"""What the downloader writes last, once every file of the revision is verified."""
PROBE_CONTAINER = "probe"
PROBE_SCRIPT = (
    'missing=0; for path in "$@"; do if [ -f "$path" ]; then echo "present $path"; '
    'else echo "missing $path"; missing=1; fi; done; exit "$missing"'
)


def markers(ctx: PlanInputs) -> list[tuple[str, str]]:
    """(what, marker path) the workload needs on the models volume: the checkpoint the cluster
    serves and, serving a hub drafter, that drafter's download."""
    model = ctx.model
    found = [(f"{model.repo}@{model.revision[:12]}", f"{target_model_path(model)}/{MARKER}")]
    drafter = ctx.drafter
    if ctx.kind.release and isinstance(drafter, Drafter) and drafter.source.hub:
        hub = drafter.source.hub
        where = drafter_path(ctx.drafter_name, drafter)
        found.append(
            (f"drafter {ctx.drafter_name} ({hub.repo}@{hub.revision[:12]})", f"{where}/{MARKER}")
        )
    return found


def probe(ctx: PlanInputs) -> ObjectPlan | None:
    """The probe Job for this plan, or None where the pods read no downloaded weights or the
    volume is the hosts' own disk (checked by `host check` over SSH)."""
    if not ctx.kind.reads_weights or ctx.cluster.weights_via != "job":
        return None
    settings = ctx.cluster.workloads.weights
    image = ctx.project.images[ctx.cluster.images.publish or ctx.cluster.images.vocab]
    volumes, mounts = pods.claim_volumes(ctx, {"models": True})
    writable_volumes, writable_mounts = pods.writable_volumes()
    return pods.probe_job(
        ctx,
        component="weights-probe",
        fail_at_once={"containerName": PROBE_CONTAINER, "operator": "In", "values": [1]},
        pod_annotations=settings.pod_annotations,
        container={
            "node_selector": dict(sorted(ctx.cluster.node_selector.items())),
            "image": image.reference,
            "command": ["sh", "-c", PROBE_SCRIPT, PROBE_CONTAINER],
            "args": [path for _, path in markers(ctx)],
            "env": [],
            "resources": pods.resources("100m", "64Mi", 0),
            "volumes": [*volumes, *writable_volumes],
            "volume_mounts": [*mounts, *writable_mounts],
        },
    )
