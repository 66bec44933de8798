"""The Grafana dashboard of one serve release, as Grafana's dashboard sidecar provisions it.

kube-prometheus-stack's Grafana (and any Grafana with the k8s-sidecar) loads every ConfigMap that
carries its dashboard label (`grafana_dashboard: "1"` by default). The shipped dashboard
(k8s/base/dashboards/kimideploy-vllm.json) is specialised per release: its own uid and title, the
release's served model name preselected, and, for a speculative revision, the acceptance-rate
panel coloured at this cluster's break-even rate for the drafter's k (from the step cost the
plan uses, measured or default), so a glance says whether speculation is paying.
"""

from __future__ import annotations

import copy
import hashlib
import json
from functools import lru_cache
from typing import Any

from kimideploy.paths import dashboard_path
from kimideploy.plan import calibration
from kimideploy.plan.inputs import PlanInputs, gated_levels
from kimideploy.plan.model import ObjectPlan

ACCEPTANCE_RATE_PANEL = 1
"""The panel id of "Acceptance rate (accepted / draft tokens)" in the shipped dashboard."""


@lru_cache(maxsize=1)
def shipped_dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(dashboard_path().read_text(encoding="utf-8"))
    return loaded


def dashboard_file_name(release: str) -> str:
    return f"kimideploy-{release}.json"


def release_dashboard(ctx: PlanInputs, break_even_rate: float | None) -> dict[str, Any]:
    """The shipped dashboard for this release (a deep copy; the shipped one stays as it is)."""
    dashboard = copy.deepcopy(shipped_dashboard())
    where = f"{ctx.namespace}/{ctx.release}"
    # Grafana uids are at most 40 characters; one per release and namespace.
    dashboard["uid"] = "kimideploy-" + hashlib.sha256(where.encode()).hexdigest()[:16]
    dashboard["title"] = f"kimideploy: {ctx.release} on {ctx.cluster_name} ({ctx.namespace})"
    dashboard["tags"] = sorted({*dashboard.get("tags", []), ctx.cluster_name, ctx.release})
    served = ctx.model.served_name
    for variable in dashboard["templating"]["list"]:
        if variable["name"] == "model":
            variable["current"] = {"text": [served], "value": [served]}
    if break_even_rate is not None:
        panel = next(p for p in dashboard["panels"] if p["id"] == ACCEPTANCE_RATE_PANEL)
        defaults = panel["fieldConfig"]["defaults"]
        defaults["thresholds"] = {
            "mode": "absolute",
            "steps": [
                {"color": "red", "value": None},
                {"color": "green", "value": round(break_even_rate, 4)},
            ],
        }
        defaults["custom"] = {**defaults.get("custom", {}), "thresholdsStyle": {"mode": "line"}}
        panel["description"] = (
            f"Green above {break_even_rate:.1%}: the break-even acceptance rate for k="
            f"{ctx.speculative_tokens or '?'} at the lowest gated "
            f"concurrency on {ctx.cluster_name} ({ctx.cost_model.source})."
        )
    return dashboard


def dashboard_object(ctx: PlanInputs, common: dict[str, Any]) -> ObjectPlan | None:
    """The release's dashboard ConfigMap, or None where serve.grafana_dashboard is off."""
    settings = ctx.cluster.workloads.serve.grafana_dashboard
    if not settings.enabled:
        return None
    rate = None
    k = ctx.speculative_tokens
    if k is not None and ctx.synthetic_k is None:
        rate = calibration.break_even_rate(ctx.cost_model, k, min(gated_levels(ctx)))
    text = json.dumps(release_dashboard(ctx, rate), indent=1, sort_keys=True)
    labels = {**common["labels"], settings.label: settings.label_value}
    values = {
        **common,
        "name": f"{ctx.object_name}-dashboard",
        "labels": labels,
        "data": {dashboard_file_name(ctx.release): text},
    }
    return ObjectPlan("configmap-serve", values)
