"""The gate's rule for GitOps tools: acceptance against the break-even rate as a Prometheus query
that Argo Rollouts (an AnalysisTemplate) or Flagger (a MetricTemplate) runs, written into the
release's Kustomize tree (`render serve --kustomize`) where `gate.gitops.templates` names them.

The rule is `watch`'s: vLLM's accepted draft tokens over its draft tokens in a window, against the
cluster's break-even rate for the drafter's k at the lowest gated concurrency (the step cost the
plan uses, measured or default; docs/reference/domain.md §6). A window with fewer draft tokens
than `gate.watch.min_draft_tokens` returns no value (`and on()`): Argo counts that as an error
(consecutiveErrorLimit), Flagger as a failed check, neither as a verdict on the drafter. The series
come from the release's PodMonitor (serve.pod_monitor), so the query names the namespace and the
served model as the dashboard does.

`up` never applies these objects: they are for a cluster whose GitOps tool owns the rollout, and
their CRDs are that tool's.
"""

from __future__ import annotations

from kimideploy.formats.vllm_metrics import ACCEPTED, DRAFT_TOKENS
from kimideploy.plan import pods
from kimideploy.plan.dashboard import release_break_even
from kimideploy.plan.inputs import PlanInputs
from kimideploy.plan.model import ObjectPlan


def acceptance_query(namespace: str, model: str, window: str, min_draft_tokens: int) -> str:
    """Acceptance over `window`, empty where fewer than `min_draft_tokens` were drafted."""
    selector = f'{{namespace="{namespace}",model_name="{model}"}}'
    drafted = f"sum(rate({DRAFT_TOKENS}{selector}[{window}]))"
    return (
        f"sum(rate({ACCEPTED}{selector}[{window}])) / {drafted} "
        f"and on() sum(increase({DRAFT_TOKENS}{selector}[{window}])) >= {min_draft_tokens}"
    )


def gitops_objects(ctx: PlanInputs) -> list[ObjectPlan]:
    gate = ctx.cluster.gate
    settings = gate.gitops
    rate = release_break_even(ctx)
    if not settings.templates or rate is None:
        return []
    threshold = round(rate, 4)
    labels = pods.standard_labels(ctx)
    common = {"name": f"{ctx.object_name}-acceptance", "namespace": ctx.namespace}
    model, watch = ctx.model.served_name, gate.watch
    found = []
    if "argo-rollouts" in settings.templates:
        window = f"{settings.window_s}s"
        values = {
            **common,
            "labels": labels,
            "address": settings.prometheus_url,
            "interval": f"{watch.interval_s}s",
            # watch acts on `windows_below` judged windows below; Argo fails past failureLimit.
            "failure_limit": watch.windows_below - 1,
            "success_condition": f"result[0] >= {threshold}",
            "query": acceptance_query(ctx.namespace, model, window, watch.min_draft_tokens),
        }
        found.append(ObjectPlan("analysistemplate-serve", values))
    if "flagger" in settings.templates:
        values = {
            **common,
            # Flagger's threshold lives in the Canary that refers to the template.
            "labels": labels,
            "annotations": {"kimideploy.io/threshold-min": str(threshold)},
            "address": settings.prometheus_url,
            "query": acceptance_query(
                "{{ namespace }}", model, "{{ interval }}", watch.min_draft_tokens
            ),
        }
        found.append(ObjectPlan("metrictemplate-serve", values))
    return found


def describe(ctx: PlanInputs, objects: list[ObjectPlan]) -> str | None:
    if not objects:
        return None
    rate = release_break_even(ctx) or 0.0
    kinds = ", ".join(
        "AnalysisTemplate" if o.template.startswith("analysis") else "MetricTemplate"
        for o in objects
    )
    return (
        f"{kinds} {ctx.object_name}-acceptance in --kustomize: acceptance >= {rate:.1%} "
        f"(break-even, k={ctx.speculative_tokens}) on {ctx.cluster.gate.gitops.prometheus_url}"
    )
