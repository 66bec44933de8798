"""`-o json|yaml` outcomes of the commands that change something, on the real control plane: one
document on stdout for success, failure, refusal and a gate rollback; progress stays on stderr."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.conftest import harness, rented_train_logs
from tests.integration.test_gate import (
    BENCH_PODS,
    baseline_and_v3,
    bench_log,
    by_drafter,
    gated,
)
from tests.integration.test_runs_and_errors import PROGRESS, annotations

pytestmark = pytest.mark.integration
FAST = ("--yes", "--poll", "0.2", "--scheduling-grace", "2")
COMMON = ["schema", "command", "ok", "exit_code", "status", "reason", "hint"]
RELEASE_DOC = [*COMMON, "release", "revision", "serving_revision", "verdict", "change", "startup"]
RUN_DOC = [*COMMON, "run", "results", "comparison", "calibration", "bakeoff", "estimate", "actual"]
PLAN_DOC = [*COMMON, "release", "plan"]


def outcome(result: tuple[int, str, str], keys: list[str], output: str = "json") -> dict[str, Any]:
    """The one document on stdout; its exit_code is the process's and its keys are all there."""
    code, out, err = result
    document: dict[str, Any] = json.loads(out) if output == "json" else yaml.safe_load(out)
    assert list(document) == keys, out
    assert document["schema"] == "kimideploy.outcome.v1"
    assert document["exit_code"] == code and document["ok"] == (code == 0), err
    return document


def test_up_rollback_and_down_each_print_one_document(
    kd: Callable[..., tuple[int, str, str]],
) -> None:
    up = outcome(kd("up", "serve", "--drafter", "v3", "-o", "json", *FAST), RELEASE_DOC)
    assert (up["command"], up["status"], up["revision"], up["serving_revision"]) == (
        "up serve", "deployed", 1, 1,
    )  # fmt: skip
    assert up["release"] == "kimi-k25-serve" and up["verdict"] is None and up["hint"] is None
    assert up["reason"] == "revision 1 of kimi-k25-serve is ready"

    back = outcome(kd("rollback", "serve", "--no-spec", "-o", "yaml", *FAST), RELEASE_DOC, "yaml")
    assert (back["command"], back["status"], back["revision"]) == ("rollback serve", "deployed", 2)

    applied = outcome(
        kd("up", "serve", "--drafter", "v3", "--no-wait", "-o", "json", "--yes"), RELEASE_DOC
    )
    assert (applied["status"], applied["revision"], applied["serving_revision"]) == (
        "applied", 3, None,
    )  # fmt: skip

    down = outcome(kd("down", "serve", "--yes", "-o", "json"), [*COMMON, "release", "removed"])
    assert down["status"] == "removed" and "Deployment/kimi-k25-serve" in down["removed"]
    again = outcome(kd("down", "serve", "--yes", "-o", "json"), [*COMMON, "release", "removed"])
    assert again["status"] == "nothing-to-remove" and again["removed"] == []


def test_a_failed_rollout_names_the_failed_and_the_serving_revision(
    kd: Callable[..., tuple[int, str, str]],
) -> None:
    assert kd("up", "serve", "--drafter", "none", *FAST)[0] == 0
    crash = f'serve.pod_annotations={{"{harness.CRASH_LOOP}": "true"}}'
    result = kd("up", "serve", "--drafter", "v3", "--set", crash, "-o", "json", *FAST)
    failed = outcome(result, RELEASE_DOC)
    assert result[0] == 4
    assert (failed["status"], failed["revision"], failed["serving_revision"]) == (
        "rolled-back", 2, 3,
    )  # fmt: skip
    assert "revision 2 failed" in failed["reason"] and "crash-looping" in failed["reason"]
    assert failed["hint"] == "`kimideploy history serve` shows both revisions"
    assert "rolled back automatically" in result[2]  # the prose error is still on stderr

    pull = f'serve.pod_annotations={{"{harness.IMAGE_PULL_ERROR}": "true"}}'
    kept = kd("up", "serve", "--drafter", "v3", "--set", pull, "--no-auto-rollback", "-o", "json",
              *FAST)  # fmt: skip
    left = outcome(kept, RELEASE_DOC)
    assert (left["status"], left["revision"], left["serving_revision"]) == ("failed", 4, None)


def test_refusals_before_anything_changed_are_documents_too(
    kd: Callable[..., tuple[int, str, str]],
) -> None:
    unknown = outcome(kd("up", "serve", "--drafter", "v9", "-o", "json", "--yes"), RELEASE_DOC)
    assert unknown["exit_code"] == 2 and unknown["status"] == "refused"
    assert unknown["revision"] is None and "v9" in unknown["reason"]
    # A client dry run's document is the plan (kimideploy.plan.v1) a pipeline gates on; the
    # server's dry run prints a diff and is refused with -o.
    dry = outcome(kd("up", "serve", "--drafter", "v3", "--dry-run", "-o", "json"), PLAN_DOC)
    assert dry["status"] == "planned" and dry["plan"]["refusal"] is None
    diff = outcome(kd("up", "serve", "--dry-run=server", "-o", "json"), RELEASE_DOC)
    assert diff["status"] == "refused" and "--dry-run=server prints a diff" in diff["reason"]
    stale = outcome(kd("rollback", "serve", "-o", "json", "--yes"), RELEASE_DOC)
    assert stale["status"] == "refused" and "no history" in stale["reason"]


def test_a_gate_rollback_carries_the_verdict(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    files = baseline_and_v3(tmp_path, {1: 40.0, 8: 390.0}, 0.15)
    with harness.PodHooks(testcluster, namespace, BENCH_PODS, by_drafter(files)):
        result = gated(kd, "v3", "--min-speedup", "1.1", "-o", "json")
    rejected = outcome(result, RELEASE_DOC)
    assert result[0] == 4
    assert (rejected["status"], rejected["revision"], rejected["serving_revision"]) == (
        "gate-rolled-back", 2, 3,
    )  # fmt: skip
    verdict = rejected["verdict"]
    assert verdict["decision"] == "rollback" and verdict["min_speedup"] == 1.1
    assert verdict["worst_speedup"] == pytest.approx(0.667, abs=1e-3)
    assert {(lv["prompt_set"], lv["concurrency"]) for lv in verdict["levels"]} >= {("chat", 1)}

    files["v3"] = bench_log(tmp_path / "v3-fast.log", "v3", {1: 90.0, 8: 520.0}, 0.7)
    with harness.PodHooks(testcluster, namespace, BENCH_PODS, by_drafter(files)):
        result = gated(kd, "v3", "--min-speedup", "1.1", "-o", "json")
    kept = outcome(result, RELEASE_DOC)
    assert (kept["status"], kept["revision"], kept["serving_revision"]) == ("deployed", 4, 4)
    assert kept["verdict"]["decision"] == "keep"


def test_run_outcomes_for_a_complete_a_failed_and_a_detached_run(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    rented_train_logs(testcluster, namespace, tmp_path / "train.log", PROGRESS)
    b300 = ("--cluster", "b300", "--set", "train.nodes=2", "--poll", "0.3", "-o", "json")
    done = outcome(kd("run", "train", *b300, "--set", annotations(run_duration="1s")), RUN_DOC)
    assert done["command"] == "run train" and done["status"] == "complete"
    run = done["run"]
    assert (run["phase"], run["completions"], run["succeeded"], run["failed_indexes"]) == (
        "complete", 2, 2, [],
    )  # fmt: skip
    assert done["results"]["1"] == {"loss": 1.42, "acceptance_pos0": 0.61}
    assert done["comparison"] is None and done["calibration"] is None and done["bakeoff"] is None
    # Hours and money: predicted before the run, the truth after it against the prediction.
    estimate, actual = done["estimate"], done["actual"]
    assert estimate["workload"] == "train" and estimate["gpus"] == 16 and estimate["money"] > 0
    assert actual["predicted_s"] == estimate["seconds"] and actual["wall_s"] > 0
    assert actual["gpu_hours"] == pytest.approx(actual["wall_s"] * 16 / 3600, abs=1e-3)

    failing = annotations(run_duration="1s", fail_index="1")
    result = kd("run", "train", *b300, "--set", failing)
    failed = outcome(result, RUN_DOC)
    assert result[0] == 4 and failed["status"] == "failed"
    assert failed["run"]["phase"] == "failed" and failed["run"]["failed_indexes"] == [1]
    assert "exited 1" in failed["run"]["index_failures"]["1"]
    assert failed["run"]["id"] in failed["hint"]

    detached = outcome(kd("run", "train", *b300, "--detach"), RUN_DOC)
    assert detached["status"] == "started" and detached["run"]["job"].startswith("kimi-k25-train-")
    assert detached["hint"] == f"follow with: kimideploy logs {detached['run']['id']} --follow"
