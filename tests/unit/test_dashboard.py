"""The Grafana dashboard is valid JSON and queries only metrics the pinned vLLM exposes."""

from __future__ import annotations

import json
import re

import pytest

from kimideploy.images.verify import vllm_sources
from tests.conftest import REPO

DASHBOARD = REPO / "k8s" / "base" / "dashboards" / "kimideploy-vllm.json"
SUFFIXES = ("", "_total", "_bucket", "_sum", "_count")


@pytest.fixture(scope="module")
def exposed() -> set[str]:
    """Every metric name vLLM 0.16.0 registers, as Prometheus exposes it."""
    source = vllm_sources("0.16.0") / "vllm"
    names = set()
    for path in [
        *(source / "v1" / "metrics").rglob("*.py"),
        source / "v1" / "spec_decode" / "metrics.py",
    ]:
        names.update(re.findall(r'name="(vllm:[a-z_:]+)"', path.read_text()))
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
    ):
        assert needed in titles
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
