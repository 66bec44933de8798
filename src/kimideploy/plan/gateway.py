"""Serving behind a Gateway API Inference Extension route, and the canary pool beside it.

The serve release's pods form an InferencePool (inference.networking.k8s.io/v1, as the pinned
sigs.k8s.io/gateway-api-inference-extension v1.6.2 defines it), each pool with its own Endpoint
Picker; one HTTPRoute (gateway.networking.k8s.io/v1) on the cluster's Gateway sends the traffic
to the pools by weight. A canary (`up serve --canary P`) is a second pool of one pod with the new
drafter, `P` percent of the route. The extension's own model kinds (InferenceObjective,
InferenceModelRewrite) were removed from it and are not rendered.

Why kimideploy renders its own picker objects rather than llm-d-router's Helm charts: the
objects are few (a Deployment, a Service, an account bound to the read-only ClusterRole that
k8s/base/rbac.yaml ships), every release renders through one templating path that is validated
offline and on the test control plane, and the charts would bring a second renderer and a chart
version to pin for the same flags the extension's lwepp takes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kimideploy.config.clusters import GatewaySettings
from kimideploy.errors import UsageError
from kimideploy.formats.endpoint_picker import PICKER_CLUSTER_ROLE, PICKER_SUFFIX, picker_account
from kimideploy.plan import pods
from kimideploy.plan.asks import ServeAsk
from kimideploy.plan.inputs import CANARY_SUFFIX, PlanInputs
from kimideploy.plan.model import ObjectPlan

POOL_GROUP = "inference.networking.k8s.io"


def gateway_of(ctx: PlanInputs) -> GatewaySettings | None:
    return ctx.cluster.gateway if ctx.kind.release and ctx.run_id is None else None


def canary_refusal(ctx: PlanInputs) -> UsageError | None:
    """Why this cluster cannot run a canary pool beside the serving one, or None."""
    if ctx.asked(ServeAsk).canary_percent is None:
        return None
    gpus, serve = ctx.cluster.gpu.per_node, ctx.cluster.workloads.serve
    needed = (serve.replicas + 1) * gpus
    if ctx.cluster.total_gpus < needed:
        return UsageError(
            f"cluster {ctx.cluster_name} cannot hold a canary: its {ctx.cluster.total_gpus} GPUs "
            f"hold {serve.replicas} serving cop{'y' if serve.replicas == 1 else 'ies'} of "
            f"{gpus} and a canary is one more ({needed} GPUs)",
            hint="compare drafters on the one server instead, by swapping them over the same "
            "prompts: `kimideploy run bench --drafters A,B --rounds 4`",
        )
    if ctx.cluster.gateway is None:
        return UsageError(
            f"cluster {ctx.cluster_name} has no gateway: a canary is a share of an HTTPRoute's "
            "traffic, and nothing routes the serve release through one",
            hint=f"set clusters.{ctx.cluster_name}.gateway (the Gateway's name and the "
            "endpoint picker's image; docs/usage/serving-and-rollback.md, 'A canary')",
        )
    if ctx.drafter is None and ctx.model_free is None:
        return UsageError(
            "--canary needs --drafter: the canary pool serves a drafter beside the serving pool",
            hint="`kimideploy rollback serve --no-spec` returns all traffic to plain serving",
        )
    return None


def routing_objects(ctx: PlanInputs) -> list[ObjectPlan]:
    """The pool of the pods this plan renders, its picker, and the route: for the release
    (every serve revision on a cluster with a gateway) or for a canary (both pools, since the
    route names both)."""
    gateway = gateway_of(ctx)
    if gateway is None:
        return []
    share = ctx.asked(ServeAsk).canary_percent
    stable = dataclasses.replace(
        ctx, ask=dataclasses.replace(ctx.asked(ServeAsk), canary_percent=None)
    )
    pools = [stable] if share is None else [stable, ctx]
    objects = [_access(stable, kind) for kind in ("serviceaccount", "rolebinding")]
    for pool in pools:
        objects += _pool(pool, gateway)
    objects.append(_route(stable, gateway, share or 0))
    return objects


def _common(ctx: PlanInputs, name: str, component: str | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": ctx.namespace,
        "labels": pods.standard_labels(ctx, component),
    }


def _access(ctx: PlanInputs, kind: str) -> ObjectPlan:
    name = picker_account(ctx.release)
    values = _common(ctx, name, "endpoint-picker")
    values.update(cluster_role=PICKER_CLUSTER_ROLE, service_account=name)
    return ObjectPlan(kind, values)


def _pool(ctx: PlanInputs, gateway: GatewaySettings) -> list[ObjectPlan]:
    picker = gateway.endpoint_picker
    name = ctx.object_name
    picker_name = f"{name}{PICKER_SUFFIX}"
    port = ctx.cluster.workloads.serve.port
    component = f"{ctx.component}-picker"
    picker_selector = {
        "app.kubernetes.io/instance": ctx.release,
        "app.kubernetes.io/component": component,
    }
    pool = {
        **_common(ctx, name),
        "selector": pods.selector_labels(ctx),
        "port": port,
        "picker": picker_name,
        "picker_port": picker.grpc_port,
        "failure_mode": picker.failure_mode,
    }
    args = [
        "--pool-name", name,
        "--pool-namespace", ctx.namespace,
        "--pool-group", POOL_GROUP,
        "--grpc-port", str(picker.grpc_port),
        "--grpc-health-port", str(picker.health_port),
        "--endpoint-target-ports", str(port),
        *picker.args,
    ]  # fmt: skip
    deployment = {
        **_common(ctx, picker_name, component),
        "selector": picker_selector,
        "pod_labels": pods.standard_labels(ctx, component),
        "service_account": picker_account(ctx.release),
        "security": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "image": picker.image,
        "args": args,
        "resources": pods.resources("200m", "256Mi", 0),
        "security_context": pods.container_hardening(),
        "grpc_port": picker.grpc_port,
        "health_port": picker.health_port,
    }
    service = {
        **_common(ctx, picker_name, component),
        "selector": picker_selector,
        "grpc_port": picker.grpc_port,
    }
    return [
        ObjectPlan("inferencepool", pool),
        ObjectPlan("deployment-endpoint-picker", deployment),
        ObjectPlan("service-endpoint-picker", service),
    ]


def _route(ctx: PlanInputs, gateway: GatewaySettings, canary_percent: int) -> ObjectPlan:
    parent: dict[str, Any] = {"name": gateway.name}
    if gateway.namespace and gateway.namespace != ctx.namespace:
        parent["namespace"] = gateway.namespace
    if gateway.section_name:
        parent["sectionName"] = gateway.section_name
    return ObjectPlan(
        "httproute",
        {
            **_common(ctx, ctx.release),
            "parent_refs": [parent],
            "backend_refs": backend_refs(ctx.release, canary_percent),
        },
    )


def backend_refs(release: str, canary_percent: int) -> list[dict[str, Any]]:
    """The route's pools by weight: the release's alone, or both with the canary's share (a
    weight of 0 keeps the canary's pool named and sends it nothing)."""
    stable = {"group": POOL_GROUP, "kind": "InferencePool", "name": release}
    if not canary_percent:
        return [{**stable, "weight": 100}]
    canary = {**stable, "name": f"{release}{CANARY_SUFFIX}", "weight": canary_percent}
    return [{**stable, "weight": 100 - canary_percent}, canary]


def route_weights(route: dict[str, Any]) -> dict[str, int]:
    """Pool name -> weight, as a rendered or live HTTPRoute has them."""
    refs = route["spec"]["rules"][0]["backendRefs"]
    return {ref["name"]: int(ref.get("weight", 1)) for ref in refs}


def with_canary_share(route: dict[str, Any], release: str, percent: int) -> dict[str, Any]:
    """The same route with the canary's share set (0 or 100 after a verdict); both pools stay
    named, so the gateway's view of them does not change with the weight."""
    rule = {**route["spec"]["rules"][0]}
    stable = {"group": POOL_GROUP, "kind": "InferencePool", "name": release}
    rule["backendRefs"] = [
        {**stable, "weight": 100 - percent},
        {**stable, "name": f"{release}{CANARY_SUFFIX}", "weight": percent},
    ]
    return {**route, "spec": {**route["spec"], "rules": [rule, *route["spec"]["rules"][1:]]}}
