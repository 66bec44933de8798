"""The Grafana dashboard is valid JSON and queries only metrics the pinned vLLM exposes."""

from __future__ import annotations

import json
import re

import pytest

from kimideploy.images.verify import vllm_sources
from tests.conftest import REPO

DASHBOARD = REPO / "k8s" / "base" / "dashboards" / "kimideploy-vllm.json"
SUFFIXES = ("", "_total", "_bucket", "_sum", "_count")


@pytest.fixture(scope="module", params=["0.16.0", "0.32.0"])
def exposed(request: pytest.FixtureRequest) -> set[str]:
    """Every metric name the pinned vLLM registers, as Prometheus exposes it: the dashboard serves
    the 0.16 host and the 0.32 clusters alike."""
    source = vllm_sources(request.param) / "vllm"
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
