"""The GitOps gate's templates on a real Prometheus: the query `render serve --kustomize` writes
into the Argo Rollouts AnalysisTemplate (and, with Flagger's variables filled in as Flagger fills
them, the MetricTemplate) answers the acceptance `formats/vllm_metrics` computes from two scrapes;
its success condition passes a drafter above break-even and fails one below; a quiet window
answers nothing (an error for Argo, not a verdict)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kimideploy.formats import vllm_metrics
from kimideploy.services.rendering import kustomize_files
from tests import observability
from tests.integration.test_per_position_panel import Engine, serving
from tests.local_http import answering
from tests.unit.test_gitops_gate import with_templates

pytestmark = pytest.mark.integration
SERVED = "kimi-k2.5"


def templates(tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    # 40 draft tokens a scrape, a scrape a second: 100 are drafted within a few seconds.
    watch = {"min_draft_tokens": 100}
    loaded = with_templates(tmp_path, watch, templates=["argo-rollouts", "flagger"], window_s=30)
    files, _ = kustomize_files(loaded, "serve", "v3", (), clusters=["b200"])
    found = {
        p.name.split("-")[0]: yaml.safe_load(t) for p, t in files.items() if "template-" in p.name
    }
    return found["analysistemplate"], found["metrictemplate"]


def quiet(handler: Any) -> None:
    """An engine serving no speculative traffic: counters that do not move."""
    body = (
        "# TYPE vllm:spec_decode_num_draft_tokens_total counter\n"
        f'vllm:spec_decode_num_draft_tokens_total{{model_name="{SERVED}",engine="0"}} 5000\n'
        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
        f'vllm:spec_decode_num_accepted_tokens_total{{model_name="{SERVED}",engine="0"}} 2500\n'
    ).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "text/plain; version=0.0.4")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def test_the_templates_queries_judge_acceptance_against_break_even(
    observability_binaries: tuple[Path, Path], tmp_path: Path
) -> None:
    analysis, metric = templates(tmp_path / "config")
    [measure] = analysis["spec"]["metrics"]
    query = measure["provider"]["prometheus"]["query"]
    threshold = float(measure["successCondition"].removeprefix("result[0] >= "))
    engine = Engine(SERVED, counts_lengths=False)
    measured = vllm_metrics.acceptance(engine.scrape(), engine.scrape())
    assert measured is not None and measured.rate == pytest.approx(0.5)  # 20 of 40 per scrape
    with serving(engine) as address, answering(quiet) as idle:
        jobs = [
            {"job_name": "kimi", "scrape_interval": "1s", "scrape_timeout": "1s",
             "static_configs": [{"targets": [address], "labels": {"namespace": "kimi"}}]},
            {"job_name": "idle", "scrape_interval": "1s", "scrape_timeout": "1s",
             "static_configs": [{"targets": [idle], "labels": {"namespace": "idle"}}]},
        ]  # fmt: skip
        with observability.prometheus(observability_binaries[0], tmp_path / "p", jobs) as server:
            [argo] = server.wait_for(query, timeout=90)
            assert argo["value"] == pytest.approx(measured.rate)
            # Argo's successCondition on that answer: 50% is above v3's break-even at c=1.
            assert argo["value"] >= threshold and threshold < 0.5
            # Flagger fills {{ namespace }} and {{ interval }} from the Canary before querying.
            flagger = metric["spec"]["query"].replace("{{ namespace }}", "kimi")
            flagger = flagger.replace("{{ interval }}", "30s")
            [answered] = server.wait_for(flagger, timeout=30)
            assert answered["value"] == pytest.approx(measured.rate)
            # The same rule fails a drafter below break-even: the query's own arithmetic, with
            # the threshold raised above what the engine accepts.
            assert not server.query(f"({query}) >= {min(0.99, measured.rate + 0.1)}")
            # No draft tokens in the window: no answer, not a verdict.
            silent = metric["spec"]["query"].replace("{{ namespace }}", "idle")
            silent = silent.replace("{{ interval }}", "30s")
            server.wait_for('up{job="idle"} == 1', timeout=30)
            assert server.query(silent) == []
