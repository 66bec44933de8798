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
PER_POSITION_PANEL = 3
"""The panel id of "Per-position acceptance" in the shipped dashboard."""
RATE = '{{model_name=~"$model"{extra}}}[$__rate_interval]'


def per_position_expr(k: int) -> str:
    """Position i accepted over the drafts that reached it, from the per-length counter where
    the engine exports it (vllm_metrics.DRAFTS_BY_LENGTH; newer than the pinned vLLMs), else
    the shipped panel's expression over every draft, which is exact at a fixed k and understates
    the later positions where drafts vary in length (suffix decoding, n-gram).

    PromQL cannot compare a label numerically, so each position's denominator names the lengths
    that reach it (`draft_length=~"2|3"` for position 1 at k=3); `or` keeps the first answer per
    position, so the fallback fills only positions the exact form did not answer."""
    accepted = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    by_length = "vllm:spec_decode_num_drafts_by_draft_length_total"
    exact = []
    for position in range(k):
        lengths = "|".join(str(n) for n in range(position + 1, k + 1))
        numerator = RATE.format(extra=f',position="{position}"')
        denominator = RATE.format(extra=f',draft_length=~"{lengths}"')
        exact.append(
            f"(sum by (position) (rate({accepted}{numerator})) / ignoring(position) group_left "
            f"sum(rate({by_length}{denominator})))"
        )
    fallback = shipped_per_position_expr()
    return " or ".join([*exact, f"({fallback})"])


def shipped_per_position_expr() -> str:
    panel = next(p for p in shipped_dashboard()["panels"] if p["id"] == PER_POSITION_PANEL)
    expr: str = panel["targets"][0]["expr"]
    return expr


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
    if ctx.speculative_tokens:
        panel = next(p for p in dashboard["panels"] if p["id"] == PER_POSITION_PANEL)
        panel["targets"][0]["expr"] = per_position_expr(ctx.speculative_tokens)
        panel["description"] = (
            f"Position i accepted given the draft reached it (k={ctx.speculative_tokens}): exact "
            "where vLLM counts drafts by length; otherwise over every draft, exact at a fixed k "
            "and understated at later positions where drafts vary in length."
        )
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


def release_break_even(ctx: PlanInputs) -> float | None:
    """The acceptance rate speculation must reach on this release: break-even for its k at the
    lowest gated concurrency (the lowest bar, as `watch` judges); None without a drafter or in a
    calibration (a synthetic k is not a drafter's)."""
    k = ctx.speculative_tokens
    if k is None or ctx.synthetic_k is not None:
        return None
    return calibration.break_even_rate(ctx.cost_model, k, min(gated_levels(ctx)))


def dashboard_object(ctx: PlanInputs, common: dict[str, Any]) -> ObjectPlan | None:
    """The release's dashboard ConfigMap, or None where serve.grafana_dashboard is off."""
    settings = ctx.cluster.workloads.serve.grafana_dashboard
    if not settings.enabled:
        return None
    text = json.dumps(release_dashboard(ctx, release_break_even(ctx)), indent=1, sort_keys=True)
    labels = {**common["labels"], settings.label: settings.label_value}
    values = {
        **common,
        "name": f"{ctx.object_name}-dashboard",
        "labels": labels,
        "data": {dashboard_file_name(ctx.release): text},
    }
    return ObjectPlan("configmap-serve", values)
