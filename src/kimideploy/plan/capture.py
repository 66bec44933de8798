"""Served prompts recorded for `drafter refresh` (serve.capture): the sidecar that takes the serve
pod's API port, vLLM moved to the engine port, and where the records go.

vLLM keeps listening on every address (on `engine_port`), so the kubelet's probes reach it
directly: a sidecar that dies is restarted alone and never takes a 25-minute reload with it. The
Service, the NetworkPolicy, the gateway's pool and the PodMonitor keep naming the API port,
which is now the sidecar's: every client's request passes through it, and the scrape reads
vLLM's series with the capture's own appended. The records go to the datasets volume, the only
claim the sidecar mounts writable (vLLM's container does not mount it)."""

from __future__ import annotations

from typing import Any

from kimideploy.config.specs import SPEC_PATH, CaptureSpec
from kimideploy.config.workloads import CaptureSettings
from kimideploy.plan import pods
from kimideploy.plan.inputs import DATASETS_MOUNT, PlanInputs

CAPTURE_CONTAINER = "capture"
ENGINE_PORT_NAME = "engine"
API_PORT_NAME = "http"
SIDECAR_CLAIMS = {"datasets": False}
"""The claims the sidecar alone mounts (writable): planned with the release's others."""


def settings(ctx: PlanInputs) -> CaptureSettings | None:
    return ctx.cluster.workloads.serve.capture if ctx.kind.release else None


def capture_folder(ctx: PlanInputs, capture: CaptureSettings) -> str:
    """This release's folder on the datasets volume, relative (what `drafter refresh` reads)."""
    return f"{capture.path}/{ctx.object_name}"


def capture_spec(ctx: PlanInputs) -> CaptureSpec | None:
    capture = settings(ctx)
    if capture is None:
        return None
    return CaptureSpec(
        directory=f"{DATASETS_MOUNT}/{capture_folder(ctx, capture)}",
        listen_port=ctx.cluster.workloads.serve.port,
        engine_port=capture.engine_port,
        retention_days=capture.retention_days,
        max_prompts_per_day=capture.max_prompts_per_day,
        sample_rate=capture.sample_rate,
        keep_request_fields=list(capture.keep_request_fields),
    )


def engine_port(ctx: PlanInputs) -> int:
    """Where vLLM listens: the API port, or the engine port behind a capture sidecar."""
    capture = settings(ctx)
    return capture.engine_port if capture is not None else ctx.cluster.workloads.serve.port


def engine_port_name(ctx: PlanInputs) -> str:
    return ENGINE_PORT_NAME if settings(ctx) is not None else API_PORT_NAME


def sidecar(ctx: PlanInputs) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The capture container and the volume it alone mounts (none without serve.capture)."""
    if settings(ctx) is None:
        return [], []
    port = ctx.cluster.workloads.serve.port
    volumes, mounts = pods.claim_volumes(ctx, SIDECAR_CLAIMS)
    _, spec_mount = pods.spec_volume(ctx.object_name)
    _, writable = pods.writable_volumes()
    tcp = {"tcpSocket": {"port": API_PORT_NAME}, "periodSeconds": 10, "timeoutSeconds": 3}
    container = {
        "name": CAPTURE_CONTAINER,
        "image": ctx.image.reference,
        "command": ["python", "-m", "kimideploy.workloads", "capture-proxy", "--spec", SPEC_PATH],
        "ports": [{"name": API_PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        "resources": pods.resources("1", "1Gi", 0),
        "readinessProbe": {**tcp, "failureThreshold": 3},
        "livenessProbe": {**tcp, "failureThreshold": 6},
        "volumeMounts": [*mounts, spec_mount, *writable],
        "securityContext": pods.container_hardening(),
    }
    return [container], volumes
