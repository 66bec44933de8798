"""Served-prompt capture (serve.capture): off unless set; when set, a sidecar takes the API port
and vLLM moves behind it, its probes still on vLLM itself; identities are refused in the config;
`status` reads what the folder holds from the sidecars' series."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from kimideploy.config.loading import LoadedProject
from kimideploy.config.workloads import CaptureSettings
from kimideploy.formats.capture_status import capture_state
from kimideploy.plan.model import Plan, PlanRequest
from kimideploy.plan.resolve import resolve

CAPTURE = 'serve.capture={"retention_days": 5, "keep_request_fields": ["tools"]}'


def obj(plan: Plan, template: str) -> dict[str, Any]:
    return next(o.values for o in plan.objects if o.template == template)


def test_capture_is_off_unless_configured(example: LoadedProject) -> None:
    plan = resolve(example, PlanRequest("serve", "rtx6000", "v3"))
    deployment = obj(plan, "deployment-serve")
    assert deployment["sidecars"] == [] and deployment["port_name"] == "http"
    assert deployment["port"] == 8000
    assert "datasets" not in {v["name"] for v in deployment["volumes"]}
    # Not even a null key: the spec (and the pods' hash of it) is what it was before capture.
    assert "capture" not in json.loads(obj(plan, "configmap-serve")["data"]["spec.json"])


def test_capture_puts_a_sidecar_on_the_api_port_and_vllm_behind_it(
    example: LoadedProject,
) -> None:
    plan = resolve(example, PlanRequest("serve", "rtx6000", "v3", overrides=(CAPTURE,)))
    deployment = obj(plan, "deployment-serve")
    (sidecar,) = deployment["sidecars"]
    assert sidecar["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert sidecar["command"][-3:] == ["capture-proxy", "--spec", "/etc/kimideploy/spec.json"]
    assert {"name": "datasets", "mountPath": "/data", "readOnly": False} in sidecar["volumeMounts"]
    # vLLM: the engine port, the probes on it (a dead sidecar never restarts the engine), and
    # no datasets mount of its own.
    assert (deployment["port"], deployment["port_name"]) == (8001, "engine")
    args = deployment["args"]
    assert args[args.index("--port") + 1] == "8001"
    assert {p["httpGet"]["port"] for p in deployment["probes"].values()} == {8001}
    assert all(m["name"] != "datasets" for m in deployment["volume_mounts"])
    service = obj(plan, "service-serve")
    assert service["port"] == 8000  # clients, the gateway and the scrape keep the API port
    spec = json.loads(obj(plan, "configmap-serve")["data"]["spec.json"])["capture"]
    assert spec["directory"] == "/data/capture/kimi-k25-serve"
    assert (spec["retention_days"], spec["keep_request_fields"]) == (5, ["tools"])
    claims = {o.values["name"] for o in plan.objects if o.template.startswith("persistentvolume")}
    assert "kimi-k25-datasets" in claims


@pytest.mark.parametrize("field", ["user", "safety_identifier", "prompt_cache_key"])
def test_an_identity_is_never_an_allowed_field(field: str) -> None:
    with pytest.raises(ValidationError, match="identifies a person or a session"):
        CaptureSettings(keep_request_fields=["tools", field])


def test_capture_needs_per_request_acceptance(example: LoadedProject) -> None:
    from kimideploy.errors import KimiDeployError

    off = (CAPTURE, "serve.per_request_spec_metrics=false")
    with pytest.raises(KimiDeployError, match="needs per_request_spec_metrics"):
        resolve(example, PlanRequest("serve", "rtx6000", "v3", overrides=off))


def test_status_reads_what_the_capture_holds() -> None:
    pod = (
        "vllm:num_requests_running 0\n"
        "kimideploy_capture_prompts 1234\nkimideploy_capture_days 3\n"
        "kimideploy_capture_bytes 2500000\nkimideploy_capture_retention_days 14\n"
        "kimideploy_capture_over_cap_total 7\n"
        'kimideploy_capture_info{oldest_day="2026-12-06"} 1\n'
    )
    state = capture_state({"a": pod, "b": pod.replace("1234", "1200")}, "capture/r")
    assert state["capture_prompts"] == 1234  # one folder: the most any pod holds, not a sum
    assert state["capture"] == (
        "on: 1,234 prompts over 3 days since 2026-12-06 (2.5 MB) in capture/r, kept 14 days; "
        "14 passed unrecorded over the daily cap"
    )
    assert capture_state({"a": "vllm:x 1\n"}, "capture/r")["capture"].endswith(
        "(no pod reported yet)"
    )
