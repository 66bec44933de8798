"""The promotion gate and the live acceptance watch of a cluster's serve release."""

from typing import Annotated, Literal

from pydantic import Field

from kimideploy.config.base import StrictModel


class WatchSettings(StrictModel):
    """Live acceptance against the cluster's break-even rate (docs/reference/domain.md §6)."""

    interval_s: Annotated[int, Field(ge=5, le=3600)] = Field(
        default=60, description="Seconds between scrapes of the serve pods' /metrics."
    )
    min_draft_tokens: Annotated[int, Field(ge=1, le=10_000_000)] = Field(
        default=2000,
        description="Draft tokens a window needs before it is judged (quiet windows are noise).",
    )
    windows_below: Annotated[int, Field(ge=1, le=100)] = Field(
        default=3, description="Consecutive judged windows below break-even before acting."
    )
    action: Literal["flag", "rollback"] = Field(
        default="flag",
        description="flag: report it; rollback: return to non-speculative serving.",
    )
    collapse_guard_s: Annotated[int, Field(ge=0, le=7 * 24 * 3600)] = Field(
        default=3600,
        description="Seconds after a drafter swap (or speculation switched on) during which one "
        "judged window whose mean acceptance length is below 1.05 acts at once, whatever the "
        "break-even: a drafter that accepts nothing after a swap was loaded wrong (0: off).",
    )


class GitOpsGate(StrictModel):
    """The gate's rule for GitOps tools: acceptance over the window against the break-even rate,
    as the Prometheus query Argo Rollouts or Flagger runs (plan/analysis.py)."""

    templates: list[Literal["argo-rollouts", "flagger"]] = Field(
        default_factory=list,
        description="Which to write into `render serve --kustomize` for a speculative release: "
        "an Argo Rollouts AnalysisTemplate, a Flagger MetricTemplate (their CRDs must be "
        "installed where the tree is applied; `up` never applies them).",
    )
    prometheus_url: Annotated[str, Field(pattern=r"^https?://[^\s]+$")] = Field(
        default="http://prometheus-operated.monitoring.svc:9090",
        description="The Prometheus the templates query (kube-prometheus-stack's by default).",
    )
    window_s: Annotated[int, Field(ge=30, le=3600)] = Field(
        default=300,
        description="The rate window of the Argo query; Flagger's is the Canary's interval.",
    )


class GateSettings(StrictModel):
    """`up serve --gate`: keep a drafter only when the measured speedup pays."""

    min_speedup: Annotated[float, Field(gt=0, le=10)] = Field(
        default=1.05,
        description="Output tokens/s with the drafter over the non-speculative baseline, required "
        "for every prompt set at every gated concurrency level.",
    )
    concurrency: list[Annotated[int, Field(ge=1, le=4096)]] | None = Field(
        default=None, description="Levels the verdict depends on (default: bench.concurrency)."
    )
    baseline_max_age_h: Annotated[float, Field(gt=0, le=24 * 90)] = Field(
        default=72, description="A non-speculative baseline older than this is measured again."
    )
    fail_open: bool = Field(
        default=False,
        description="When the gate itself fails (bench failed, metrics missing), keep the "
        "drafter instead of rolling back.",
    )
    baseline: Literal["auto", "same-server", "separate"] = Field(
        default="auto",
        description="Where the non-speculative baseline comes from when no fresh stored one "
        "compares. same-server: the drafter's own pods with speculation switched off (vLLM "
        "0.32 with patch 0002: seconds, no second load), benched in rounds interleaved with "
        "the drafter; separate: a non-speculative revision of its own (one more model load). "
        "auto: same-server where the pods can switch, else separate.",
    )
    same_server_rounds: Annotated[int, Field(ge=1, le=10)] = Field(
        default=2,
        description="With the same-server baseline: rounds of drafter and baseline benches, "
        "in alternating order, whose means are judged.",
    )
    watch: WatchSettings = Field(default_factory=WatchSettings)
    gitops: GitOpsGate = Field(default_factory=GitOpsGate)
