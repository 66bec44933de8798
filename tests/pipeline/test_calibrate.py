"""`run calibrate` for real: vLLM 0.32 serves the rendered calibration revision (synthetic rejection
sampling, the control extension, dev mode) and the bench workload sets each acceptance length
through it, then measures; vLLM's own counters must show the length asked for.

Tolerance: ACCEPTANCE_TOLERANCE (0.15) on the mean acceptance length per level. The minimum-
variance schedule accepts each full position always and the fractional one with its rate, so over
the ~hundreds of drafts of a level the standard error is ~0.03; 0.15 also covers the requests'
last steps, which max_tokens cuts short.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.pipeline import pods
from tests.pipeline.conftest import Served, Volumes, service_urls
from tests.pipeline.figures import FIGURES

from kimideploy.config.loading import LoadedProject
from kimideploy.formats.bench_result import BenchResult
from kimideploy.plan.asks import BenchAsk, ServeAsk, SyntheticAcceptance
from kimideploy.plan.calibration import fit
from kimideploy.services.calibrate.sweep import ACCEPTANCE_TOLERANCE, points_from

K = 2
LENGTHS = (1.5, 2.5, 3.0)
LEVELS = "bench.concurrency=[4]"
PROMPTS = "bench.num_prompts=12"  # three passes (lengths): fewer prompts than the acceptance bench


@pytest.fixture(scope="module")
def calibration_run(
    cpu_python: Path,
    project: LoadedProject,
    volumes: Volumes,
    served: dict[str, Served],
    untrained_drafter: dict[str, Any],
) -> dict[str, Any]:
    synthetic = SyntheticAcceptance(K, LENGTHS)
    rendered = pods.rendered(project, "serve", "untrained", ask=ServeAsk(synthetic=synthetic))
    assert rendered.vllm_model is not None and rendered.vllm_env == {
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_USE_V2_MODEL_RUNNER": "0",
    }
    server, _ = volumes.start_serving(cpu_python, rendered, "serve-calibration")
    try:
        pods.wait_ready([server], timeout=600)
        bench = pods.rendered(project, "bench", "untrained", overrides=(LEVELS, PROMPTS),
                              ask=BenchAsk(synthetic=synthetic))  # fmt: skip
        spec = volumes.spec(bench, **service_urls(project, server))
        code, out, err = pods.run_workload(cpu_python, "bench", spec, volumes.root,
                                           mounts=volumes.mounts(bench, "bench-calibration"),
                                           **bench.secret_env)  # fmt: skip
    finally:
        server.stop()
    assert code == 0, err[-3000:]
    return {"result": pods.events(out, "result")[-1], "baseline": served["none"].bench}


def test_vllm_accepts_at_the_synthetic_length_the_bench_set_and_the_fit_follows(
    calibration_run: dict[str, Any],
) -> None:
    levels = calibration_run["result"]["levels"]
    assert sorted({lv["synthetic_acceptance_length"] for lv in levels}) == list(LENGTHS)
    for level in levels:
        asked, got = level["synthetic_acceptance_length"], level["mean_acceptance_length"]
        FIGURES[f"calibrate k={K}: asked {asked}, {level['prompt_set']}"] = got
        assert got == pytest.approx(asked, abs=ACCEPTANCE_TOLERANCE), level
    points = points_from(
        K,
        BenchResult.from_dict(calibration_run["result"]),
        BenchResult.from_dict(calibration_run["baseline"]),
    )
    assert len(points) == len(levels)
    (cost,) = fit(points)
    FIGURES[f"calibrate k={K}: step cost at c=4 (CPU)"] = f"{cost.cost} (residual {cost.residual})"
    assert cost.cost > 0 and cost.levels == len(levels)
