"""The calibration model: the fit, the predictions that use it, and the plans `run calibrate` makes."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from kimideploy.config.loading import LoadedProject, load_project
from kimideploy.errors import UsageError
from kimideploy.formats.bench_result import BenchResult
from kimideploy.plan import calibration as cal
from kimideploy.plan.asks import BenchAsk, ServeAsk, SyntheticAcceptance
from kimideploy.plan.calibration import Calibration, lengths_for
from kimideploy.plan.k_schedule import choose_schedule
from kimideploy.plan.model import ClusterAnswers, PlanRequest
from kimideploy.plan.resolve import resolve
from kimideploy.services.calibrate.report import cannot_pay, rows
from kimideploy.services.calibrate.sweep import points_from
from kimideploy.workloads.synthetic_acceptance import (
    conditional_rates,
    rates_for_length,
    validate_rates,
)

TRUE_COST = {(1, 1): 1.18, (2, 1): 1.34, (3, 1): 1.52, (1, 32): 1.9, (2, 32): 2.7, (3, 32): 3.4}
BASE = {1: 60.0, 32: 900.0}


def measured(noise: float = 0.02, seed: int = 7) -> list[cal.Point]:
    """What a calibration run would measure if the step cost were TRUE_COST (with noise)."""
    rng = random.Random(seed)
    points = []
    for (k, c), cost in TRUE_COST.items():
        for length in lengths_for(k, (1.5, 2.0, 2.5, 3.0, 3.5)):
            got = length * (1 + rng.uniform(-0.03, 0.03))  # vLLM's counters vs the request
            tokens = BASE[c] * got / cost * (1 + rng.uniform(-noise, noise))
            points.append(cal.Point(k, c, "chat", length, round(got, 3), tokens, BASE[c]))
    return points


def calibration_of(points: list[cal.Point], **changes: object) -> cal.Calibration:
    base = cal.Calibration(
        cluster="b200", image="img@sha256:1", serve_fingerprint="f" * 16, bench_fingerprint="b",
        gpus="8 x B200", drafter="v3", measured_at="2026-12-01T10:00:00+0000", ks=[1, 2, 3],
        lengths=[1.5, 2.0, 2.5, 3.0, 3.5], concurrency=[1, 32], baseline_run="abc123",
        points=points, complete=True,
    )  # fmt: skip
    return replace(base, **changes)  # type: ignore[arg-type]


def test_the_fit_recovers_a_known_step_cost_from_noisy_measurements() -> None:
    fitted = {(s.k, s.concurrency): s for s in cal.fit(measured())}
    assert set(fitted) == set(TRUE_COST)
    for key, cost in TRUE_COST.items():
        assert fitted[key].cost == pytest.approx(cost, rel=0.03), key
        assert fitted[key].residual < 0.04
    exact = {(s.k, s.concurrency): s.cost for s in cal.fit(measured(noise=0.0))}
    assert all(exact[key] == pytest.approx(cost, rel=0.005) for key, cost in TRUE_COST.items())


def test_a_bad_model_shows_in_the_residual() -> None:
    """If speedup did not scale with acceptance length the fit says so instead of hiding it."""
    flat = [cal.Point(2, 1, "chat", length, length, 70.0, 60.0) for length in (1.5, 2.0, 3.0)]
    assert cal.fit_step_cost(flat).residual > 0.15


def test_measured_costs_interpolate_and_extrapolate_in_k_and_concurrency() -> None:
    costs = cal.MeasuredCost(calibration_of(measured(noise=0.0)))
    assert costs.cost(2, 1) == pytest.approx(1.34, rel=0.01)
    between = costs.cost(2, 8)  # log2 8 is 3/5 of the way from 1 to 32
    assert between == pytest.approx(1.34 + 0.6 * (2.7 - 1.34), rel=0.02)
    assert costs.cost(2, 64) == pytest.approx(costs.cost(2, 32))
    assert costs.cost(5, 1) == pytest.approx(1 + 5 * costs.per_token(1), rel=1e-6)
    assert 0.15 < costs.per_token(1) < 0.2  # the measured counterpart of step_cost_per_token
    assert cal.break_even_length(costs, 3, 32) == pytest.approx(3.4, rel=0.01)
    assert cal.speedup(costs, 3, 3.4, 32) == pytest.approx(1.0, rel=0.01)


def test_show_names_break_even_best_k_and_where_nothing_pays() -> None:
    calibration = calibration_of(measured(noise=0.0))
    table = {r["concurrency"]: r for r in rows(calibration, (0.5, 0.8))}
    assert table[1]["break-even k=3"] == pytest.approx(1.52, abs=0.02)
    assert table[32]["best k @a=0.5"] == "none pays"
    assert table[1]["best k @a=0.8"].startswith("k=3 ")
    lines = cannot_pay(calibration)
    assert lines[0] == "at c=1 no k pays below acceptance length 1.18"
    assert "at c=32 no k pays below acceptance length 1.90" in lines
    assert lines[-1] == "at c >= 32 no k pays below acceptance length 1.90"


def test_the_stored_form_round_trips_and_rejects_another_schema() -> None:
    calibration = calibration_of(measured())
    again = cal.Calibration.from_dict(json.loads(json.dumps(calibration.to_dict())))
    assert again == calibration
    with pytest.raises(ValueError, match="unknown calibration schema"):
        cal.Calibration.from_dict({**calibration.to_dict(), "schema": "other"})


def test_rates_match_vllms_minimum_variance_schedule_and_rules() -> None:
    assert rates_for_length(2.5, 3) == [1.0, 0.5, 0.0]
    assert rates_for_length(4.0, 3) == [1.0, 1.0, 1.0]
    assert rates_for_length(1.0, 2) == [0.0, 0.0]
    assert conditional_rates([0.6, 0.3, 0.1]) == pytest.approx([0.6, 0.5, 1 / 3])
    assert conditional_rates([1.0, 0.0, 0.0]) == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match=r"\[1, 4\]"):
        rates_for_length(4.5, 3)
    with pytest.raises(ValueError, match="non-increasing"):
        validate_rates([0.5, 0.6], 2)
    assert lengths_for(1, (1.5, 2.0, 3.0)) == (1.5, 2.0)
    assert lengths_for(1, (3.0,)) == (2.0,)


def test_points_pair_each_synthetic_level_with_the_baselines_level() -> None:
    result = {"levels": [
        {"prompt_set": "chat", "concurrency": 8, "output_tokens_per_s": 500.0,
         "synthetic_acceptance_length": 2.0, "mean_acceptance_length": 1.98},
        {"prompt_set": "chat", "concurrency": 4, "output_tokens_per_s": 300.0,
         "synthetic_acceptance_length": 2.0, "mean_acceptance_length": 2.01},
        {"prompt_set": "chat", "concurrency": 8, "output_tokens_per_s": 0.0,
         "synthetic_acceptance_length": 3.0, "mean_acceptance_length": None},
    ]}  # fmt: skip
    baseline = {"levels": [{"prompt_set": "chat", "concurrency": 8, "output_tokens_per_s": 400.0}]}
    (point,) = points_from(2, BenchResult.from_dict(result), BenchResult.from_dict(baseline))
    assert (point.k, point.concurrency, point.length) == (2, 8, 1.98)
    assert point.speedup == pytest.approx(1.25)


def serve_plan(
    example: LoadedProject, calibrations: tuple[Calibration, ...] = (), **request: object
) -> object:
    answers = ClusterAnswers(calibrations=calibrations)
    asked = {k: request.pop(k) for k in ("image", "synthetic") if k in request}
    ask = ServeAsk(**asked) if asked else None  # type: ignore[arg-type]
    return resolve(example, PlanRequest("serve", **request, ask=ask), answers)  # type: ignore[arg-type]


def facts(plan: object) -> dict[str, str]:
    return dict(plan.facts)  # type: ignore[attr-defined]


def calibration_for(example: LoadedProject, cluster: str, **changes: object) -> cal.Calibration:
    plan = resolve(example, PlanRequest("serve", cluster, "none"))
    return calibration_of(measured(noise=0.0), cluster=cluster, image=plan.image,
                          serve_fingerprint=plan.inputs["serve_fingerprint"],
                          **changes)  # fmt: skip


def test_predictions_switch_to_the_stored_calibration_and_say_which(
    example: LoadedProject,
) -> None:
    before = facts(serve_plan(example, cluster="b200", drafter="v3"))
    assert before["step cost"].startswith("prior for 8x B200 (NVL8)")
    stored = calibration_for(example, "b200")
    plan = serve_plan(example, cluster="b200", drafter="v3", calibrations=(stored,))
    after = facts(plan)
    assert after["step cost"] == "measured on 2026-12-01 (`kimideploy calibrate show`)"
    assert after["predicted"] != before["predicted"]
    assert plan.break_even["measured"] is True  # type: ignore[attr-defined]
    k = example.project.drafters["v3"].num_speculative_tokens
    level = min(plan.break_even["length"], key=int)  # type: ignore[attr-defined]
    assert plan.break_even["length"][level] == pytest.approx(  # type: ignore[attr-defined]
        cal.MeasuredCost(stored).cost(k, int(level)), abs=1e-3
    )


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"image": "ghcr.io/other@sha256:2"}, "was measured on image ghcr.io/other@sha256:2"),
        ({"serve_fingerprint": "0" * 16}, "another serve configuration"),
        ({"cluster": "b300"}, None),
    ],
)
def test_a_calibration_of_another_image_or_configuration_is_not_used(
    example: LoadedProject, changes: dict[str, object], reason: str | None
) -> None:
    stored = replace(calibration_for(example, "b200"), **changes)  # type: ignore[arg-type]
    plan = serve_plan(example, cluster="b200", drafter="v3", calibrations=(stored,))
    step = facts(plan)["step cost"]
    assert step.startswith("prior for")
    if reason:
        assert reason in step and step.endswith("so not used")
    changed = serve_plan(example, cluster="b200", drafter="v3",
                         overrides=("serve.max_num_seqs=17",),
                         calibrations=(calibration_for(example, "b200"),))  # fmt: skip
    assert "another serve configuration" in facts(changed)["step cost"]


def test_the_calibration_revision_serves_synthetic_acceptance_with_the_control_extension(
    example: LoadedProject,
) -> None:
    plan = serve_plan(example, cluster="b200", drafter="v3",
                      synthetic=SyntheticAcceptance(2, (1.5, 2.0, 3.0)))  # fmt: skip
    deployment = next(o.values for o in plan.objects if o.template == "deployment-serve")
    args = deployment["args"]
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens"] == 2
    assert spec["rejection_sample_method"] == "synthetic"
    assert spec["synthetic_acceptance_length"] == 1.5
    extension = args[args.index("--worker-extension-cls") + 1]
    assert extension == "kimideploy.workloads.synthetic_acceptance.SyntheticAcceptanceControl"
    assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in deployment["env"]
    assert deployment["pod_labels"]["kimideploy.io/calibration-k"] == "2"
    plain = serve_plan(example, cluster="b200", drafter="v3")
    plain_args = next(o.values for o in plain.objects if o.template == "deployment-serve")["args"]
    assert "--worker-extension-cls" not in plain_args
    bench = resolve(example, PlanRequest("bench", "b200", "v3", ask=BenchAsk(
        synthetic=SyntheticAcceptance(2, (1.5, 2.0)))))  # fmt: skip
    spec_map = next(o.values for o in bench.objects if o.template == "configmap-spec")
    sweep = json.loads(spec_map["data"]["spec.json"])["synthetic"]
    assert sweep["acceptance_lengths"] == [1.5, 2.0] and sweep["num_speculative_tokens"] == 2
    assert sweep["control_url"].endswith(":8000/collective_rpc")


def test_an_image_without_synthetic_rejection_sampling_is_refused_naming_one_that_has_it(
    example: LoadedProject,
) -> None:
    with pytest.raises(UsageError) as refused:
        serve_plan(example, cluster="rtx6000", drafter="v3", image="vllm-0.16-kimi",
                   synthetic=SyntheticAcceptance(3, (2.0,)))  # fmt: skip
    assert "vllm-0.16-kimi (vLLM 0.16.0)" in refused.value.message
    assert "vllm-0.32-kimi has it" in refused.value.message
    assert refused.value.hint == "--image vllm-0.32-kimi calibrates that stack instead"
    moved = serve_plan(example, cluster="rtx6000", drafter="v3", image="vllm-0.32-kimi",
                       synthetic=SyntheticAcceptance(3, (2.0,)))  # fmt: skip
    assert moved.inputs["image_name"] == "vllm-0.32-kimi"  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match=r"outside \[1, 2\]"):
        serve_plan(example, cluster="b200", drafter="v3", synthetic=SyntheticAcceptance(1, (2.5,)))


def test_the_k_schedule_stops_drafting_where_it_cannot_pay() -> None:
    costs = cal.MeasuredCost(calibration_of(measured(noise=0.0)))
    good = [0.8, 0.7, 0.6]
    schedule = choose_schedule("auto", costs, good, 3, max_num_seqs=64, vllm="0.32.0")
    assert schedule.ranges[0][:2] == (1, 5) and schedule.ranges[0][2] >= 2
    assert schedule.ranges[-1] == (6, 64, 0) or schedule.ranges[-1][2] < schedule.ranges[0][2]
    assert schedule.ranges[-1][1] == 64
    predicted = {c: (k, s) for c, k, s in schedule.predicted}
    assert predicted[32][1] >= 1.0
    assert "k by batch size 1-5" in schedule.describe()
    assert choose_schedule("fixed", costs, good, 3, max_num_seqs=64, vllm="0.32.0").ranges == ()
    old = choose_schedule("auto", costs, good, 3, max_num_seqs=64, vllm="0.16.0")
    assert old.ranges == () and "needs >= 0.32" in old.note
    default = choose_schedule(
        "auto", cal.DefaultCost(0.14, "b200"), good, 3, max_num_seqs=64, vllm="0.32.0"
    )
    assert default.ranges == () and "needs a calibration" in default.note


def test_training_plans_say_what_acceptance_the_gate_needs(example: LoadedProject) -> None:
    plan = resolve(example, PlanRequest("train", "b200"))
    needed = dict(plan.facts)["acceptance needed"]
    assert needed.startswith("to pass the gate (") and "prior for" in needed
    stored = calibration_for(example, "b200")
    expensive = replace(stored, points=[replace(p, tokens_per_s=p.tokens_per_s / 3)
                                        for p in stored.points])  # fmt: skip
    slow = resolve(example, PlanRequest("train", "b200"), ClusterAnswers(calibrations=(expensive,)))
    assert "measured on 2026-12-01" in dict(slow.facts)["acceptance needed"]
    assert any("no acceptance length up to k+1" in w for w in slow.warnings)


def test_k_schedule_auto_renders_the_batch_size_schedule_from_the_calibration(
    edited_config: Callable[..., Path],
) -> None:
    path = edited_config((
        "      dataset: datasets/synthetic-v3\n",
        "      dataset: datasets/synthetic-v3\n    k_schedule: auto\n"
        "    acceptance: [0.8, 0.7, 0.6]\n",
    ))  # fmt: skip
    loaded = load_project(path)
    plain = serve_plan(loaded, cluster="b200", drafter="v3")
    assert "needs a calibration" in facts(plain)["k schedule"]
    assert "num_speculative_tokens_per_batch_size" not in json.dumps(
        [o.values for o in plain.objects]  # type: ignore[attr-defined]
    )
    stored = calibration_for(loaded, "b200")
    plan = serve_plan(loaded, cluster="b200", drafter="v3", calibrations=(stored,))
    objects = plan.objects  # type: ignore[attr-defined]
    args = next(o.values for o in objects if o.template == "deployment-serve")["args"]
    spec = json.loads(args[args.index("--speculative-config") + 1])
    schedule = spec["num_speculative_tokens_per_batch_size"]
    seqs = loaded.project.clusters["b200"].workloads.serve.max_num_seqs
    assert schedule[0][0] == 1 and schedule[-1][1] == seqs
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(schedule))
    shown = facts(plan)["k schedule"]
    assert shown.startswith("k by batch size 1-") and "predicted c=1 k=" in shown


def test_a_complete_calibration_predicts_before_a_newer_partial_one(example: LoadedProject) -> None:
    complete = calibration_for(example, "b200")
    partial = replace(complete, complete=False, measured_at="2026-12-02T10:00:00+0000",
                      points=[replace(p, tokens_per_s=p.tokens_per_s / 2) for p in complete.points])  # fmt: skip
    plan = serve_plan(example, cluster="b200", drafter="v3", calibrations=(complete, partial))
    assert facts(plan)["step cost"] == "measured on 2026-12-01 (`kimideploy calibrate show`)"


def test_up_judges_the_drafter_with_the_step_cost_measured_on_the_cluster_it_deploys_to(
    example: LoadedProject,
) -> None:
    """One judgement: the plan's findings, which `up` refuses on, use the cost model
    the plan predicts with, on the plan's own cluster, not the default cluster's constant."""
    from kimideploy.services.release.deploy import refuse_failing_drafter

    drafters = dict(example.project.drafters)
    drafters["v3"] = drafters["v3"].model_copy(update={"acceptance": [0.6, 0.35, 0.2]})
    project = example.project.model_copy(update={"drafters": drafters})
    loaded = replace(example, project=project)
    stored = calibration_for(loaded, "b200")
    expensive = replace(stored, points=[replace(p, tokens_per_s=p.tokens_per_s / 3)
                                        for p in stored.points])  # fmt: skip
    cheap = resolve(loaded, PlanRequest("serve", "b200", "v3"))
    costly = resolve(
        loaded, PlanRequest("serve", "b200", "v3"), ClusterAnswers(calibrations=(expensive,))
    )
    default, measured = ({f.name: f for f in p.drafter_findings}["predicted speedup"]
                         for p in (cheap, costly))  # fmt: skip
    assert default.ok and "prior for" in default.detail
    assert not measured.ok and "measured on 2026-12-01" in measured.detail
    assert facts(costly)["step cost"].startswith("measured on 2026-12-01")
    assert any("SLOWER" in w for w in costly.warnings)
    refuse_failing_drafter(cheap, force=False)
    with pytest.raises(UsageError, match="drafter v3 fails its check: predicted speedup"):
        refuse_failing_drafter(costly, force=False)


def test_a_calibration_with_a_zero_baseline_is_not_read_and_does_not_poison_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A level whose baseline measured 0 tok/s (a failed bench, or a planted ConfigMap) would
    divide by zero in every prediction that read it, and stayed in the local copy."""
    from kimideploy.services import calibration_copies as calibrations
    from tests.conftest import EXAMPLE

    good = {"k": 3, "concurrency": 1, "prompt_set": "chat", "requested_length": 2.0,
            "measured_length": 2.0, "tokens_per_s": 80.0, "baseline_tokens_per_s": 60.0}  # fmt: skip
    poisoned = {**good, "baseline_tokens_per_s": 0.0}
    stored = {"schema": cal.CALIBRATION_SCHEMA, "cluster": "rtx6000", "image": "i", "serve_fingerprint": "s",
              "bench_fingerprint": "b", "gpus": "8", "drafter": "v3", "measured_at": "2026-12-01T00:00:00+0000",
              "ks": [3], "lengths": [2.0], "concurrency": [1], "baseline_run": "r", "points": [poisoned]}  # fmt: skip
    with pytest.raises(ValueError, match=r"has 80\.0 tokens/s over a baseline of 0\.0"):
        cal.Calibration.from_dict(stored)
    monkeypatch.setenv("KIMIDEPLOY_CALIBRATION_CACHE", str(tmp_path))
    loaded = load_project(EXAMPLE)
    copy = calibrations.cache_file(loaded, "rtx6000")
    copy.parent.mkdir(parents=True)
    copy.write_text(json.dumps([stored]))
    assert calibrations.cached(loaded, "rtx6000") == ()  # read as no calibration, not a crash
    assert cal.Calibration.from_dict({**stored, "points": [good]}).costs[0].cost > 0


def test_the_bakeoff_gives_each_drafter_its_k_by_batch_size_from_what_it_measured() -> None:
    """The bake-off table's per-position acceptance (mean over prompt sets and levels) and the
    cluster's calibration give the schedule `k_schedule: auto` would serve; a drafter whose
    acceptance falls off after the first position drafts fewer tokens where a step costs more."""
    from kimideploy.services.gate.bakeoff import Bakeoff, BakeoffRow, with_k_schedules

    costs = cal.MeasuredCost(calibration_of(measured(noise=0.0)))

    def row(candidate: str, c: int, per_position: list[float] | None) -> BakeoffRow:
        return BakeoffRow("chat", c, candidate, 100.0, 0.5, 2.0, per_position, 1.2, True)

    strong = [0.9, 0.85, 0.8]
    weak_tail = [0.75, 0.3, 0.1]
    table = Bakeoff(
        [
            row("none", 1, None),
            row("v4", 1, strong),
            row("v4", 32, strong),
            row("v2", 1, [0.8, 0.35, 0.1]),
            row("v2", 32, [0.7, 0.25, 0.1]),
            row("ngram", 1, None),
        ],
        {1: "v4", 32: "v4"},
        {},
    )
    judged = with_k_schedules(table, {"v4": 3, "v2": 3, "v1": 3}, costs, 64, vllm="0.32.0")
    assert (
        judged.k_schedules["v4"]
        == choose_schedule("auto", costs, strong, 3, max_num_seqs=64, vllm="0.32.0").describe()
    )
    assert (
        judged.k_schedules["v2"]
        == choose_schedule("auto", costs, weak_tail, 3, max_num_seqs=64, vllm="0.32.0").describe()
    )
    v2 = choose_schedule("auto", costs, weak_tail, 3, max_num_seqs=64, vllm="0.32.0")
    assert [k for _, _, k in v2.ranges] != [3]  # it varies: fewer drafts where steps cost more
    assert "k by batch size" in judged.k_schedules["v4"]
    assert judged.k_schedules["v1"] == "no per-position acceptance counted; k stays as served"
    assert "ngram" not in judged.k_schedules  # model-free: not an EAGLE-3 candidate
    assert judged.as_dict()["k_schedules"] == judged.k_schedules
    uncalibrated = with_k_schedules(
        table, {"v4": 3}, cal.DefaultCost(0.14, "b200"), 64, vllm="0.32.0"
    )
    assert "needs a calibration" in uncalibrated.k_schedules["v4"]


def test_calibrate_show_offline_prints_the_prior_then_the_local_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a cluster: the prior the plan uses until `run calibrate` (its break-even lengths
    from the same cost model), then, once a cluster was read, its last calibration's copy."""
    import json

    from kimideploy.cli.main import main
    from kimideploy.config.loading import load_project
    from kimideploy.plan.step_cost import uncalibrated
    from kimideploy.services.calibration_copies import remember
    from tests.conftest import EXAMPLE

    monkeypatch.setenv("KIMIDEPLOY_CALIBRATION_CACHE", str(tmp_path))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))  # no cluster can be reached
    assert main(["calibrate", "show", "--cluster", "b200", "--offline", "-o", "json"]) == 0
    prior = json.loads(capsys.readouterr().out)
    assert prior["source"].startswith("cluster b200, nothing measured: the prior the plan uses")
    costs = uncalibrated(load_project(EXAMPLE).project, "b200")
    first = prior["table"][0]
    assert first["concurrency"] == 1
    assert first["break-even k=3"] == round(cal.break_even_length(costs, 3, 1), 2)
    assert main(["calibrate", "show", "--cluster", "b200", "--offline", "-o", "png"]) == 2
    assert "no calibration here to plot" in capsys.readouterr().err
    remember(load_project(EXAMPLE), "b200", (calibration_of(measured(noise=0.0)),))
    assert main(["calibrate", "show", "--cluster", "b200", "--offline"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("calibration (local copy) of cluster b200, measured 2026-12-01")
    assert "no k pays" not in out.splitlines()[0]
