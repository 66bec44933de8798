"""Hours, GPUs and money before a run: the priors against the figures they come from, a measured
rate in their place, the lifecycle added up and drawn, the rental's end as a limit, and
`run --dry-run` for every run kind judged as the run itself. On the control plane (the rates
a finished run keeps, the server dry run): tests/integration/test_estimates.py."""

from __future__ import annotations

import dataclasses
import json
import xml.etree.ElementTree as ElementTree
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kimideploy.cli.main import main
from kimideploy.cluster.jobs import JobSnapshot
from kimideploy.config.loading import LoadedProject
from kimideploy.plan.estimates import (
    SEED_EXTRACT_TOKENS_PER_S,
    decode_tokens_per_s,
    rental_refusal,
)
from kimideploy.plan.model import OFFLINE, ClusterAnswers, PlanRequest
from kimideploy.plan.resolve import plan_inputs, resolve
from kimideploy.plan.stage_estimate import MeasuredRate
from kimideploy.services.lifecycle import lifecycle, serve_loads
from kimideploy.services.runs.run_rates import against_prediction, measured_rate


def stage(example: LoadedProject, workload: str, cluster: str, *overrides: str,
          answers: ClusterAnswers = OFFLINE) -> Any:  # fmt: skip
    plan = resolve(example, PlanRequest(workload, cluster, None, overrides), answers)
    assert plan.stage_estimate is not None, workload
    return plan.stage_estimate


def test_the_priors_reproduce_the_hand_built_pipelines_figures(example: LoadedProject) -> None:
    # Datagen: 10,000 samples of ~1,450 tokens in just over 5 hours (~800 tokens/s); the
    # step-cost model at 32 requests in flight on the PCIe host.
    ctx = plan_inputs(example, PlanRequest("datagen", "rtx6000"))
    assert decode_tokens_per_s(ctx, 32) == pytest.approx(800, rel=0.1)
    datagen = stage(example, "datagen", "rtx6000", "datagen.concurrency=8")  # 4 shards x 8
    assert datagen.seconds / 3600 == pytest.approx(5.0, rel=0.12)
    # Extraction: 3,165 tokens/s on one 8-GPU engine, plus its start.
    extract = stage(example, "extract", "rtx6000")
    assert extract.rate == pytest.approx(SEED_EXTRACT_TOKENS_PER_S * extract_shards(example))
    # Training: 5 epochs over 10,000 samples in 2.6 h on the 8 GPUs.
    train = stage(example, "train", "rtx6000", "train.held_out_fraction=0", "train.batch_size=4")
    assert train.seconds / 3600 == pytest.approx(2.6, rel=0.1)
    assert not train.measured and "prior" in train.source and train.spread == (0.5, 2.0)


def extract_shards(example: LoadedProject) -> int:
    return example.project.clusters["rtx6000"].workloads.extract.shards


def test_gpu_hours_and_money_follow_the_gpus_the_stage_holds(example: LoadedProject) -> None:
    train = stage(example, "train", "b300")
    profile = example.project.clusters["b300"]
    assert train.gpus == profile.workloads.train.nodes * profile.gpu.per_node
    assert train.gpu_hours == pytest.approx(train.gpus * train.seconds / 3600)
    assert train.money(6.0) == pytest.approx(train.gpu_hours * 6.0)
    line = dict(resolve(example, PlanRequest("train", "b300")).facts)["estimate"]
    assert (
        f"{train.gpu_hours:,.1f} GPU-hours on {train.gpus} GPUs" in line
        and "$6.00/GPU-hour" in line
    )
    datagen = stage(example, "datagen", "b300")
    assert datagen.gpus == profile.gpu.per_node * profile.workloads.serve.replicas  # the release's
    assert stage(example, "vocab", "b300").gpus == 0


def test_a_measured_rate_replaces_the_prior_for_the_same_unit(example: LoadedProject) -> None:
    prior = stage(example, "train", "b300")
    rate = MeasuredRate("train", "steps", 0.5, 240.0, 3600.0, 32, "abc123", "2026-12-01T10:00:00Z")
    other = MeasuredRate("train", "tokens", 9.0, 1.0, 1.0, 32, "old", "2026-11-01T00:00:00Z")
    measured = stage(example, "train", "b300",
                     answers=ClusterAnswers(rates=(rate, other)))  # fmt: skip
    assert measured.measured and measured.spread == (0.8, 1.25)
    assert "measured by run abc123" in measured.source
    assert measured.seconds == pytest.approx(240.0 + prior.units / 0.5)
    assert measured.units == prior.units and measured.gpus == prior.gpus


@pytest.mark.parametrize(
    "entry",
    [
        {"workload": "train", "unit": "steps", "rate": -1},
        {"workload": "train", "unit": "steps", "rate": float("nan")},
        {"workload": "train", "unit": "steps", "rate": "fast"},
        {"unit": "steps", "rate": 1.0},
    ],
)
def test_a_stored_rate_of_the_wrong_shape_is_left_out(entry: dict[str, Any]) -> None:
    assert MeasuredRate.from_dict(entry) is None


def test_a_finished_run_measures_its_rate_and_its_fixed_part() -> None:
    log = "\n".join([
        "loading",
        json.dumps({"event": "progress", "stage": "train", "done": 100, "total": 100,
                    "unit": "steps", "rate": 2.0}),
        json.dumps({"event": "result", "loss": 1.0}),
    ])  # fmt: skip
    snapshot = JobSnapshot("j", "complete", 2, 2, (), logs={0: log, 1: log},
                           started_at="2026-12-07T10:00:00Z",
                           finished_at="2026-12-07T10:02:00Z")  # fmt: skip
    rate = measured_rate(snapshot, "train", "r1", 16)
    assert rate is not None
    # Two indexes at 2 steps/s each: 200 steps in 50 s; the other 70 s are the fixed part.
    assert (rate.rate, rate.wall_s, rate.startup_s, rate.unit) == (4.0, 120.0, 70.0, "steps")
    failed = dataclasses.replace(snapshot, phase="failed")
    assert measured_rate(failed, "train", "r1", 16) is None
    assert measured_rate(dataclasses.replace(snapshot, finished_at=None), "train", "r", 1) is None


def test_extraction_measures_what_a_sample_holds_and_the_next_estimate_counts_with_it(
    example: LoadedProject,
) -> None:
    """The config's expected_tokens_per_sample is a planning figure; a finished extraction
    measured the real one, and the next estimate multiplies the samples of its own plan by it."""

    def shard(samples: int, tokens: int) -> str:
        return "\n".join([
            json.dumps({"event": "progress", "stage": "extract", "done": tokens, "total": tokens,
                        "unit": "tokens", "rate": tokens / 10}),
            json.dumps({"event": "result", "samples": samples, "tokens": tokens}),
        ])  # fmt: skip

    snapshot = JobSnapshot("j", "complete", 2, 2, (), logs={0: shard(100, 30_000),
                           1: shard(300, 90_000)}, started_at="2026-12-07T10:00:00Z",
                           finished_at="2026-12-07T10:01:00Z")  # fmt: skip
    rate = measured_rate(snapshot, "extract", "x1", 16)
    assert rate is not None and rate.units_per_sample == 300.0
    assert MeasuredRate.from_dict(rate.to_dict()) == rate
    prior = stage(example, "extract", "rtx6000")
    planned = example.project.clusters["rtx6000"].workloads.datagen
    assert prior.units == planned.samples * planned.expected_tokens_per_sample
    measured = stage(example, "extract", "rtx6000", "datagen.samples=2000",
                     answers=ClusterAnswers(rates=(rate,)))  # fmt: skip
    assert measured.units == 2000 * 300.0 and "300 tokens per sample (measured)" in measured.detail
    assert measured.seconds == pytest.approx(rate.startup_s + 2000 * 300.0 / rate.rate)
    # A stage counted in samples keeps no such figure.
    samples = JobSnapshot("j", "complete", 1, 1, (), logs={0: shard(100, 100).replace(
        '"tokens"', '"samples"', 1)}, started_at="2026-12-07T10:00:00Z",
        finished_at="2026-12-07T10:01:00Z")  # fmt: skip
    counted = measured_rate(samples, "vocab", "v1", 0)
    assert counted is not None and counted.units_per_sample is None


def test_the_run_says_what_it_took_against_the_prediction(example: LoadedProject) -> None:
    predicted = stage(example, "train", "b300")
    actual = MeasuredRate("train", "steps", 1.0, 0.0, predicted.seconds * 1.2, 32, "r", "t")
    line, facts = against_prediction(predicted, actual, 6.0)
    assert facts["off"] == pytest.approx(0.2, abs=1e-3)
    assert "(+20%" in line and "kept for the next estimate" in line
    assert facts["money"] == pytest.approx(32 * actual.wall_s / 3600 * 6.0, abs=0.01)


def test_the_lifecycle_adds_up_and_draws_its_stages(example: LoadedProject) -> None:
    planned = lifecycle(example, "b300", OFFLINE)
    assert [s.workload for s in planned.stages] == ["weights", "datagen", "vocab", "train", "bench"]
    assert any("online" in note for note in planned.notes)  # b300 trains online: no extract
    assert planned.seconds == pytest.approx(sum(s.seconds for s in planned.stages))
    document = planned.to_dict()
    assert document["money"] == pytest.approx(planned.gpu_hours * 6.0, abs=0.01)
    assert document["held_gpu_hours"] == pytest.approx(64 * planned.seconds / 3600, abs=0.01)
    chart = ElementTree.fromstring(planned.svg())
    bars = [e for e in chart.iter() if e.tag.endswith("rect")]
    assert len(bars) == len(planned.stages)
    rows = planned.rows()
    assert rows[-1]["stage"] == "total" and rows[1]["starts"] == "+20 min"
    offline = lifecycle(example, "rtx6000", OFFLINE)
    assert "extract" in [s.workload for s in offline.stages]
    assert any("host sync-model" in note for note in offline.notes)


def test_a_bakeoff_and_a_calibration_count_their_serve_loads(example: LoadedProject) -> None:
    bake = serve_loads(example, "b300", OFFLINE, candidates=("ngram", "k25"))
    [stage_] = bake.stages
    bench = stage(example, "bench", "b300")
    start = resolve(example, PlanRequest("bench", "b300")).engine_start_estimate_s
    assert stage_.seconds == pytest.approx(3 * start + 3 * bench.seconds)  # none, ngram, k25
    calibration = serve_loads(example, "b300", OFFLINE, candidates=None)
    assert calibration.stages[0].startup_s == pytest.approx(5 * start)


def test_the_rental_end_is_a_limit(example: LoadedProject) -> None:
    from kimideploy.config.clusters import Rental

    train = stage(example, "train", "b300")
    now = datetime(2026, 12, 7, 12, tzinfo=UTC)
    roomy = Rental(ends=now + timedelta(seconds=train.high_s + 3 * 3600))
    assert rental_refusal(train, "b300", roomy, now) is None
    tight = Rental(ends=now + timedelta(seconds=train.high_s + 3600))  # inside the 2 h margin
    refusal = rental_refusal(train, "b300", tight, now)
    assert refusal is not None and refusal.exit_code == 2
    assert "less its 2 h margin" in refusal.message and "--force" in (refusal.hint or "")
    assert rental_refusal(train, "b300", None, now) is None


def rented(edited_config: Any, hours: float) -> Path:
    ends = (datetime.now(UTC) + timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return edited_config((
        "    # rental: {ends: 2027-01-31T18:00:00Z, provider: Example GPU Cloud, warn_hours: 72,\n"
        "    #          margin_hours: 2}",
        f"    rental: {{ends: {ends}, provider: Example GPU Cloud, warn_hours: 72, "
        "margin_hours: 2}",
    ))  # fmt: skip


def test_a_run_past_the_rental_is_refused_before_any_cluster(
    edited_config: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.setenv("KIMIDEPLOY_ALLOW_PLACEHOLDERS", "1")
    config = rented(edited_config, 6)  # the b300 training's upper estimate is longer
    for extra in ([], ["--dry-run"]):
        code = main(["--config", str(config), "run", "train", "--cluster", "b300", *extra])
        _, err = capsys.readouterr()
        assert code == 2, err
        assert "less its 2 h margin" in err and "cannot use kube context" not in err
    assert main(["--config", str(config), "run", "train", "--cluster", "b300", "--dry-run",
                 "--force"]) == 0  # fmt: skip
    assert main(["--config", str(config), "run", "vocab", "--cluster", "b300", "--dry-run"]) == 0


@pytest.mark.parametrize("workload", ["datagen", "extract", "vocab", "train", "bench", "weights",
                                      "replay", "publish"])  # fmt: skip
@pytest.mark.parametrize("cluster", ["rtx6000", "b300"])
def test_every_run_kind_plans_as_the_run_judges(
    workload: str, cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """The dry run prints the estimate where the real run would start, and refuses with the
    same exit code and message where the real run is refused before contact."""
    from tests.conftest import EXAMPLE

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.setenv("KIMIDEPLOY_ALLOW_PLACEHOLDERS", "1")
    base = ["--config", str(EXAMPLE), "run", workload, "--cluster", cluster]
    code = main([*base, "--dry-run", "-o", "json"])
    out, err = capsys.readouterr()
    real = main(base)
    _, real_err = capsys.readouterr()
    if code == 0:
        document = json.loads(out)
        assert document["status"] == "planned"
        estimate = document["plan"]["estimate"]
        assert estimate["seconds"] > 0 and estimate["source"], estimate
        assert real == 3  # it got as far as the cluster, which is not there
    else:
        assert real == code == 2
        refused = json.loads(out)["message"] if out.strip().startswith("{") else err
        assert refused.splitlines()[0].removeprefix("error: ") in real_err


def test_the_bakeoff_and_calibrate_dry_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "bench", "--cluster", "b300", "--drafters", "ngram,k25", "--dry-run"]) == 0
    out, _ = capsys.readouterr()
    assert "bake-off" in out and "3 serve loads and benches (none, ngram, k25)" in out
    assert main(["run", "calibrate", "--cluster", "b300", "--dry-run", "-o", "json"]) == 0
    document = json.loads(capsys.readouterr()[0])
    [calibrate] = document["lifecycle"]["stages"]
    assert calibrate["workload"] == "calibrate" and calibrate["money"] is not None


def test_plan_lifecycle_writes_its_chart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chart = tmp_path / "lifecycle.svg"
    assert main(["plan", "lifecycle", "--cluster", "b300", "--chart", str(chart)]) == 0
    out, _ = capsys.readouterr()
    assert "total" in out and "holding all 64 GPUs" in out and chart.is_file()
    ElementTree.parse(chart)
