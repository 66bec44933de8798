"""Estimates from real runs, untimed (the timed comparison with the next run is a benchmark:
tests/pipeline/estimate_accuracy.py, run by bench/estimates.py): a finished run of the engine's
stages, read as `run` reads a finished Job, yields the rate and the fixed part the next plan on
the cluster counts with, and extraction the tokens per sample it found, which replaces the
config's planning figure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.pipeline import pods
from tests.pipeline.conftest import Volumes, timed_bench
from tests.pipeline.estimating import estimate, recorded

from kimideploy.config.loading import LoadedProject


def test_each_stages_run_makes_the_next_estimate_on_the_cluster(
    cpu_python: Path,
    project: LoadedProject,
    volumes: Volumes,
    target_server: pods.Server,
    conversations: dict[str, Any],
    features: dict[str, Any],
    vocab_run: dict[str, Any],
    good_drafter: dict[str, Any],
) -> None:
    _, bench_out, bench_s = timed_bench(cpu_python, project, volumes, "none", target_server)
    good_out = "\n".join(json.dumps(e) for e in good_drafter["progress"])
    runs = {
        "datagen": (conversations["stdout"], conversations["seconds"]),
        "extract": (features["stdout"], features["seconds"]),
        "vocab": (vocab_run["stdout"], vocab_run["seconds"]),
        "train": (good_out, good_drafter["seconds"]),
        "bench": (bench_out, bench_s),
    }
    samples = project.project.clusters["cpu"].workloads.datagen.samples
    for stage, (stdout, seconds) in runs.items():
        rate = recorded(stage, stdout, seconds, f"{stage}-1")
        # The run's own progress: its rate while working, the rest of its wall time fixed.
        assert rate.startup_s is not None and 0 < rate.startup_s < seconds, (stage, rate)
        found = estimate(project, stage, None, rate)
        assert found.measured and f"measured by run {stage}-1" in found.source
        assert found.seconds == pytest.approx(rate.startup_s + found.units / rate.rate)
        assert found.spread == (0.8, 1.25)
    # Extraction counts the tokens per sample its run found (the tier's config says 110).
    extract = recorded("extract", features["stdout"], features["seconds"], "extract-1")
    result = pods.events(features["stdout"], "result")[-1]
    assert extract.units_per_sample == pytest.approx(result["tokens"] / result["samples"], rel=1e-3)
    assert extract.units_per_sample != 110
    half = estimate(project, "extract", None, extract, f"datagen.samples={samples // 2}")
    assert half.units == pytest.approx(samples // 2 * extract.units_per_sample)
    assert "tokens per sample (measured)" in half.detail
