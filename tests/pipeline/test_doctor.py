"""`drafter doctor` on the engine: each known cause reproduced with a real served drafter, named
by the doctor from a real replay; a healthy drafter called healthy; `drafter check --replay`'s
prediction checked against what vLLM counted.

One replay Job, rendered for all the tier's drafters at once (`drafter doctor good shifted ...`
renders the same spec), with two prompt sets: held-out docs prompts (another domain than the
drafters' code training data) and the bench's held-out code prompts (for the prediction). Its two
containers run as the pod runs them: replay-capture with vLLM 0.32 (the CPU build) on the served
target, then replay-judge with speculators. The diagnosis is the CLI's own (services/drafters/
doctor.py `diagnoses`), with what the bench counted for each served drafter (`served`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from tests.pipeline import pods
from tests.pipeline.conftest import CONFIG, Served, Volumes, length
from tests.pipeline.figures import FIGURES

from kimideploy.config.loading import LoadedProject, load_project
from kimideploy.formats.bench_result import BenchResult
from kimideploy.plan.asks import ReplayAsk
from kimideploy.plan.drafter_doctor import Diagnosis
from kimideploy.services.drafters.doctor import (
    ReplayOutcome,
    diagnoses,
    measured_from_bench,
    read_prompts,
)

DOCTOR_DRAFTERS = ("good", "shifted", "other-template", "other-target", "untrained")
YOURS = "yours"
"""The user's prompts of another domain: held-out docs prompts (the drafters trained on code)."""
BENCH_PROMPTS = "code"
"""The bench's own held-out code prompts: `drafter check --replay` on them predicts what vLLM
counted for the served drafter."""
PREDICTION_TOLERANCE = 0.15
"""|replayed - counted| mean acceptance length at k=3 for the same prompts, both greedy."""


@pytest.fixture(scope="session")
def replayed(
    cpu_python: Path, project: LoadedProject, volumes: Volumes, served: dict[str, Served]
) -> ReplayOutcome:
    prompts = volumes.root / "data" / "prompts"
    sets = ((YOURS, read_prompts(prompts / "heldout-docs.jsonl")[:40]),
            (BENCH_PROMPTS, read_prompts(prompts / "heldout-code.jsonl")[:40]))  # fmt: skip
    rendered = pods.rendered(project, "replay", "good",
                             ask=ReplayAsk(drafters=DOCTOR_DRAFTERS, prompts=sets))  # fmt: skip
    # Two Jobs, each holding only what it uses: the capture (the served engine) and the judge.
    ran = sorted(
        next(a for a in [*c.get("command", []), *c.get("args", [])] if a.startswith("replay-"))
        for m in rendered.manifests if m["kind"] == "Job"
        for c in m["spec"]["template"]["spec"]["containers"]
    )  # fmt: skip
    assert ran == ["replay-capture", "replay-judge"], ran
    spec = volumes.spec(rendered)
    mounts = volumes.mounts(rendered, "replay")
    started = time.monotonic()
    code, out, err = pods.run_workload(cpu_python, "replay-capture", spec, volumes.root,
                                       mounts=mounts)  # fmt: skip
    assert code == 0, err[-4000:]
    captured = pods.events(out, "result")[-1]
    FIGURES["replay: capture (s), sequences"] = (
        f"{time.monotonic() - started:.1f}, {captured['sequences']}"
    )
    started = time.monotonic()
    code, out, err = pods.run_workload(cpu_python, "replay-judge", spec, volumes.root,
                                       mounts=mounts)  # fmt: skip
    assert code == 0, err[-4000:]
    FIGURES["replay: judge (s), drafters"] = (
        f"{time.monotonic() - started:.1f}, {len(DOCTOR_DRAFTERS)}"
    )
    result = pods.events(out, "result")[-1]
    result["capture_result"] = captured
    return ReplayOutcome("p1", result)


def doctor(loaded: LoadedProject, outcome: ReplayOutcome, served: dict[str, Served],
           prompt_set: str | None) -> dict[str, Diagnosis]:  # fmt: skip
    """What `drafter doctor` prints for each drafter, with the bench's counts as measured."""
    measured = {name: measured_from_bench(BenchResult.from_dict(served[name].bench), 4,
                                          f"bench of {name}")
                for name in DOCTOR_DRAFTERS}  # fmt: skip
    found = diagnoses(loaded, "cpu", outcome, measured, calibrations=(), prompt_set=prompt_set)
    return {d.drafter: d for d in found}


def show(found: dict[str, Diagnosis]) -> str:
    return "; ".join(f"{name}: {d.verdict}" for name, d in found.items())


def test_the_correct_drafter_is_healthy_and_each_mistake_is_named(
    replayed: ReplayOutcome, project: LoadedProject, served: dict[str, Served]
) -> None:
    found = doctor(project, replayed, served, None)
    FIGURES["doctor verdicts"] = show(found)
    assert found["good"].healthy, found["good"].as_dict()
    assert found["shifted"].causes[:1] == ["convention"], found["shifted"].as_dict()
    assert "template" in found["other-template"].causes, found["other-template"].as_dict()
    assert "target" in found["other-target"].causes, found["other-target"].as_dict()
    assert found["untrained"].causes == ["weak"], found["untrained"].as_dict()
    fix = next(f for f in found["shifted"].findings if f.cause == "convention").fix
    assert "aux_layer_ids: [2, 3, 4]" in fix and "vllm" in fix


def test_training_wrote_the_conversations_it_judged_beside_the_drafter(
    good_drafter: dict[str, Any],
) -> None:
    """What the doctor replays travels with the drafter: the judged held-out conversations, with
    the token ids training rendered them to."""
    out = Path(good_drafter["out"])
    lineage = json.loads((out / "kimideploy-lineage.json").read_text())
    rows = [json.loads(line) for line in (out / "replay-sample.jsonl").read_text().splitlines()]
    assert len(rows) == lineage["replay_sample"]["conversations"]
    assert len(rows) == lineage["dataset"]["held_out"]["judged_samples"]
    assert all(len(r["input_ids"]) == len(r["loss_mask"]) and sum(r["loss_mask"]) for r in rows)
    assert lineage["replay_sample"]["rendering"]["chat_template_sha256"]


def test_prompts_of_another_domain_are_named(
    replayed: ReplayOutcome, project: LoadedProject, served: dict[str, Served]
) -> None:
    good = doctor(project, replayed, served, YOURS)["good"]
    rows = {r["scenario"]: r["length"] for r in good.rows}
    FIGURES["doctor: good on its own prompts vs docs prompts (k=3)"] = (
        f"{rows['served_answers']:.2f} vs {rows['prompts:' + YOURS]:.2f}"
    )
    assert good.causes[0] == "domain", good.as_dict()


def test_a_k_beyond_what_pays_is_named_with_the_k_that_does(
    replayed: ReplayOutcome, served: dict[str, Served], tmp_path: Path
) -> None:
    """The same served drafter where a draft token costs 0.75 of a decode step (a host whose
    drafting is expensive): vLLM's per-position acceptance at k=3 says a shallower k pays more."""
    config = tmp_path / "kimideploy.yaml"
    text = CONFIG.read_text()
    assert text.count("    step_cost_per_token: 0.1433\n") == 1  # the cpu cluster's measured cost
    config.write_text(text.replace("    step_cost_per_token: 0.1433\n",
                                   "    step_cost_per_token: 0.75\n"))  # fmt: skip
    good = doctor(load_project(config), replayed, served, None)["good"]
    assert good.causes == ["k"], good.as_dict()
    best = good.prediction["best_k"]
    assert best < 3 and f"num_speculative_tokens: {best}" in good.findings[0].fix


def test_the_replay_predicts_what_vllm_counted(
    replayed: ReplayOutcome, project: LoadedProject, served: dict[str, Served]
) -> None:
    """`drafter check good --replay heldout-code.jsonl` before serving vs the bench's count
    while serving, on the same prompts."""
    good = replayed.result["drafters"]["good"]
    predicted = good["scenarios"][f"prompts:{BENCH_PROMPTS}"]["mean_acceptance_length"]["3"]
    counted = length(served["good"])
    FIGURES["good: replay prediction vs vLLM's count (k=3)"] = f"{predicted:.2f} vs {counted:.2f}"
    assert abs(predicted - counted) <= PREDICTION_TOLERANCE, (predicted, counted)
    assert good["head_agreement"] >= 0.98, good["head_agreement"]
    agreement = replayed.result["capture_result"]["renderer_agreement"]
    assert agreement["same"] == agreement["prompts"], agreement


PAIRED_CONSISTENCY = 0.002
"""The paired difference and the two scenario figures it compares are rounded separately."""


def test_the_convention_mistakes_cost_is_measured_paired_on_the_replay(
    replayed: ReplayOutcome, project: LoadedProject, served: dict[str, Served]
) -> None:
    """What moving the layers costs, on the same turns judged both ways, with a 95% interval:
    `shifted` (good's files fed the layers one above) and good fed the layers one below (a
    drafter trained in SGLang's ids, served with them read as vLLM's). Printed, not asserted
    lower: the measured costs and why are in docs/usage/drafter-doctor.md."""
    drafters = replayed.result["drafters"]
    shifted = drafters["shifted"]
    cost = shifted["layers"]["cost"]
    scenarios = shifted["scenarios"]
    figure = {name: scenarios[name]["mean_acceptance_length"]["3"]
              for name in ("served_layers", "served_rendering")}  # fmt: skip
    assert cost["k"] == 3 and cost["turns"] > 0, cost
    assert abs(cost["difference"] - (figure["served_layers"] - figure["served_rendering"])) <= (
        PAIRED_CONSISTENCY
    ), (cost, figure)
    assert cost["ci95"][0] <= cost["difference"] <= cost["ci95"][1], cost
    good = drafters["good"]
    probe = good["scenarios"][good["shifted"]["probe"]]["mean_acceptance_length"]["3"]
    for delta, moved in good["shifted"]["by"].items():
        paired = good["shifted"]["paired"][delta]
        moved_length = moved["mean_acceptance_length"]["3"]
        assert abs(paired["difference"] - (moved_length - probe)) <= PAIRED_CONSISTENCY, paired
    evidence = next(
        f.evidence for f in doctor(project, replayed, served, None)["shifted"].findings
        if f.cause == "convention"
    )  # fmt: skip
    assert "95% interval" in evidence, evidence

    def shown(paired: dict[str, Any]) -> str:
        low, high = paired["ci95"]
        return f"{paired['difference']:+.3f} [{low:+.3f}, {high:+.3f}] over {paired['turns']} turns"

    FIGURES["convention, replay k=3: shifted (+1) cost, 95%"] = shown(cost)
    FIGURES["convention, replay k=3: good fed -1, 95%"] = shown(good["shifted"]["paired"]["-1"])
