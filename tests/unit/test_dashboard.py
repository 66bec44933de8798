"""The Grafana dashboard is valid JSON and queries only metrics the pinned vLLM exposes."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import pytest

from kimideploy.formats.vllm_metrics import DRAFTS_BY_LENGTH
from kimideploy.images.verify import vllm_sources
from tests.conftest import REPO

DASHBOARD = REPO / "k8s" / "base" / "dashboards" / "kimideploy-vllm.json"
SUFFIXES = ("", "_total", "_bucket", "_sum", "_count")


@pytest.fixture(scope="module", params=["0.16.0", "0.32.0"])
def exposed(request: pytest.FixtureRequest) -> set[str]:
    """The dashboard serves the 0.16 host and the 0.32 clusters alike."""
    return exposed_by(request.param)


@functools.cache
def exposed_by(version: str) -> set[str]:
    """Every metric name the pinned vLLM registers, as Prometheus exposes it."""
    source = vllm_sources(version) / "vllm"
    names = set()
    for path in [
        *(source / "v1" / "metrics").rglob("*.py"),
        source / "v1" / "spec_decode" / "metrics.py",
    ]:
        # `name="vllm:..."` (0.16) or `("vllm:...", "doc")` tuples (0.32's spec-decode counters)
        names.update(re.findall(r'(?:name=|\()"(vllm:[a-z_:]+)"', path.read_text()))
    return {name + suffix for name in names for suffix in SUFFIXES}


def test_dashboard_queries_only_exposed_metrics(exposed: set[str]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    expressions.append(dashboard["templating"]["list"][1]["query"])
    used = {name for expr in expressions for name in re.findall(r"vllm:[a-z_:]+", expr)}
    assert used and used <= exposed, sorted(used - exposed)
    titles = " ".join(p["title"] for p in dashboard["panels"])
    for needed in (
        "Acceptance rate",
        "Mean acceptance length",
        "Per-position",
        "tokens/s",
        "first token",
        "per output token",
        "Gate verdicts",
    ):
        assert needed in titles
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_the_gate_panel_reads_only_labels_the_release_records_carry() -> None:
    """kube-state-metrics exposes Secret label `a.b/c-d` as `label_a_b_c_d`."""
    from kimideploy.cluster import records

    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    others = {
        name
        for expr in expressions
        for name in re.findall(r"(?<![a-z_:])([a-z_]+)\{", expr)
        if not name.startswith("vllm")
    }
    assert others == {"kube_secret_labels"}
    written = {
        "label_" + re.sub(r"[^a-z0-9]", "_", key)
        for key in (
            records.RECORD_LABEL,
            records.REVISION_LABEL,
            records.DRAFTER_LABEL,
            records.GATE_LABEL,
            records.GATE_SPEEDUP_LABEL,
        )
    }
    [gate_expr] = [e for e in expressions if "kube_secret_labels" in e]
    used = set(re.findall(r"label_[a-z_]+", gate_expr))
    assert used and used <= written, sorted(used - written)


def release_objects(
    cluster: str, drafter: str, *overrides: str
) -> tuple[Any, list[dict[str, Any]]]:
    from kimideploy.config.loading import load_project
    from kimideploy.plan.model import PlanRequest
    from kimideploy.services.rendering import render_workload

    rendered = render_workload(
        load_project(REPO / "kimideploy.yaml"), PlanRequest("serve", cluster, drafter, overrides)
    )
    return rendered.plan, rendered.objects


@pytest.mark.parametrize(("cluster", "vllm"), [("rtx6000", "0.16.0"), ("b300", "0.32.0")])
def test_each_release_ships_its_dashboard_for_grafanas_sidecar(cluster: str, vllm: str) -> None:
    plan, objects = release_objects(cluster, "v3")
    [config_map] = [o for o in objects if o["metadata"]["name"] == "kimi-k25-serve-dashboard"]
    assert config_map["kind"] == "ConfigMap"
    labels = config_map["metadata"]["labels"]
    assert labels["grafana_dashboard"] == "1"
    assert (
        labels["app.kubernetes.io/instance"] == "kimi-k25-serve"
    )  # pruned and rolled back with it
    [(file_name, text)] = config_map["data"].items()
    assert file_name == "kimideploy-kimi-k25-serve.json"
    dashboard = json.loads(text)
    assert len(dashboard["uid"]) <= 40 and dashboard["uid"] != "kimideploy-vllm-spec"
    assert cluster in dashboard["title"] and "kimi-k25-serve" in dashboard["title"]
    [model] = [v for v in dashboard["templating"]["list"] if v["name"] == "model"]
    assert model["current"]["value"] == ["kimi-k2.5"]
    registered = exposed_by(vllm)
    used = {n for p in dashboard["panels"] for t in p["targets"]
            for n in re.findall(r"vllm:[a-z_:]+", t["expr"])}  # fmt: skip
    # The one counter of a newer vLLM, read only where a fallback on this vLLM's counters follows.
    assert used and used - registered == {DRAFTS_BY_LENGTH}, sorted(used - registered)
    [positions] = [p for p in dashboard["panels"] if p["title"].startswith("Per-position")]
    expr = positions["targets"][0]["expr"]
    fallback = expr.rsplit(" or ", 1)[1]
    assert (
        DRAFTS_BY_LENGTH not in fallback
        and set(re.findall(r"vllm:[a-z_:]+", fallback)) <= registered
    )
    assert expr.count('draft_length=~"') == 3 and 'position="2"' in expr  # k = 3: one per position
    assert 'draft_length=~"2|3"' in expr  # position 1 is reached by drafts of length 2 and 3
    [panel] = [p for p in dashboard["panels"] if p["title"].startswith("Acceptance rate")]
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    lowest = min(plan.break_even["rate"], key=int)
    assert steps[1]["value"] == pytest.approx(plan.break_even["rate"][lowest], abs=1e-4)


def test_no_drafter_no_threshold_and_the_dashboard_can_be_turned_off() -> None:
    _, objects = release_objects("b300", "none")
    [config_map] = [o for o in objects if o["metadata"]["name"].endswith("-dashboard")]
    dashboard = json.loads(next(iter(config_map["data"].values())))
    [panel] = [p for p in dashboard["panels"] if p["title"].startswith("Acceptance rate")]
    assert "thresholds" not in panel["fieldConfig"]["defaults"]
    _, objects = release_objects("b300", "v3", "serve.grafana_dashboard.enabled=false")
    assert not [o for o in objects if o["metadata"]["name"].endswith("-dashboard")]
    _, objects = release_objects("b300", "v3", "serve.grafana_dashboard.label=dashboards.example/x")
    [config_map] = [o for o in objects if o["metadata"]["name"].endswith("-dashboard")]
    assert config_map["metadata"]["labels"]["dashboards.example/x"] == "1"
