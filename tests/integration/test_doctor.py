"""`drafter doctor` and `drafter check --replay` through the CLI on the test control plane: the
replay's two Jobs are rendered, validated by the API server and created in turn (the capture on
the cluster's capturing image and GPUs, then the judgement on its train image and one GPU),
followed to the end, and the judgement's result line is read back and diagnosed. The replay pod's log is a judge result line composed
from replay figures (the engine-side run is tests/pipeline/test_doctor.py); what is tested here is
the path from the command line to the verdict, the exit codes and the refusals."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.conftest import harness
from tests.unit.test_drafter_doctor import replay

pytestmark = pytest.mark.integration
FAST = ("--poll", "0.2")
WEAK = [0.5, 0.4, 0.3, 0.3, 0.3]


def judge_log(tmp_path: Path, **scenarios: list[float]) -> Path:
    """The replay pod's stdout: capture's progress, then the judgement of v3."""
    result = replay(**scenarios)
    result["rendering"] = {"conversations": 48, "differ": 48,
                           "first_difference": "conversation a1, token 3"}  # fmt: skip
    lines = [
        json.dumps({"event": "progress", "stage": "replay-capture", "captured": 32, "of": 64}),
        json.dumps({"event": "result", "stage": "replay", "drafters": {"v3": result},
                    "capture": {"engine": "vllm 0.32.0", "image": "vllm-0.32-kimi"}}),
    ]  # fmt: skip
    return harness.write_container_log(tmp_path / "replay.log", lines)


def test_the_doctor_runs_one_replay_job_and_names_the_cause_with_exit_5(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    log = judge_log(tmp_path, served_rendering=WEAK, served_answers=WEAK)
    harness.serve_logs(testcluster, namespace, log)
    # The host on the team's vLLM 0.16 stack, which cannot extract: the extraction image captures.
    old_stack = tmp_path / "old-stack.yaml"
    anchor = "whatever the drafter.\n      serve: vllm-0.32-kimi\n"
    old_stack.write_text((REPO / "kimideploy.yaml").read_text().replace(
        anchor, anchor.replace("0.32", "0.16"), 1))  # fmt: skip
    code, out, err = kd("drafter", "doctor", "v3", "--cluster", "rtx6000", *FAST,
                        config=old_stack)  # fmt: skip
    assert code == 5, err
    assert "drafter v3 on rtx6000 (k=3): unhealthy: template" in out
    assert "48 of 48 conversations render to other token ids" in out
    assert "fix: train again on features rendered by the served tokenizer" in out
    jobs = json.loads(testcluster.kubectl("-n", namespace, "get", "jobs", "-o", "json"))["items"]
    # Two Jobs, the judgement created once the capture succeeded: each holds only its own GPUs.
    by_stage = {j["metadata"]["labels"]["kimideploy.io/stage"]: j for j in jobs}
    assert set(by_stage) == {"capture", "judge"}
    assert (
        by_stage["judge"]["metadata"]["annotations"]["kimideploy.io/after"]
        == (by_stage["capture"]["metadata"]["name"])
    )
    assert "created Job " + by_stage["judge"]["metadata"]["name"] in err
    capture = by_stage["capture"]["spec"]["template"]["spec"]["containers"][0]
    judge = by_stage["judge"]["spec"]["template"]["spec"]["containers"][0]
    assert judge["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # vLLM 0.16 cannot extract: the extraction image captures.
    assert "vllm" in capture["image"] and capture["image"] != judge["image"]
    assert capture["resources"]["limits"]["nvidia.com/gpu"] == "8"
    spec = json.loads(testcluster.kubectl("-n", namespace, "get", "configmap", "-o", "json"))
    replay_spec = next(json.loads(c["data"]["spec.json"]) for c in spec["items"]
                       if "spec.json" in c.get("data", {}))  # fmt: skip
    assert replay_spec["capture_note"].startswith("captured on the extraction image")
    assert [d["name"] for d in replay_spec["drafters"]] == ["v3"]


def test_a_healthy_drafter_exits_0_and_json_carries_the_chain(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    harness.serve_logs(testcluster, namespace, judge_log(tmp_path))
    code, out, err = kd("drafter", "doctor", "v3", "--cluster", "rtx6000", "-o", "json", *FAST)
    assert code == 0, err
    [found] = json.loads(out)
    assert found["verdict"] == "healthy" and found["causes"] == []
    assert [r["scenario"] for r in found["scenarios"]][:3] == [
        "served_features", "served_rendering", "served_answers",
    ]  # fmt: skip
    assert found["prediction"]["best_k"] == 3


def test_check_replay_prints_the_prediction_on_the_users_prompts(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"prompt": "Write a parser."}\n{"messages": [{"role": "user", '
                       '"content": "Explain asyncio."}]}\n')  # fmt: skip
    harness.serve_logs(testcluster, namespace,
                       judge_log(tmp_path, **{"prompts:yours": [0.7, 0.6, 0.5, 0.4, 0.4]}))  # fmt: skip
    code, out, err = kd("drafter", "check", "v3", "--replay", str(prompts), "--cluster",
                        "rtx6000", "-o", "json", *FAST)  # fmt: skip
    assert code == 0, err
    predicted = json.loads(out)
    assert predicted["source"] == "replay (prompts:yours)"
    assert predicted["per_position"][:3] == [0.7, 0.6, 0.5]
    assert predicted["by_k"]["3"]["speedup"] > 1
    spec = json.loads(testcluster.kubectl("-n", namespace, "get", "configmap", "-o", "json"))
    replay_spec = next(json.loads(c["data"]["spec.json"]) for c in spec["items"]
                       if "spec.json" in c.get("data", {}))  # fmt: skip
    rows = replay_spec["prompt_sets"][0]["rows"]
    assert [r["messages"][-1]["content"] for r in rows] == ["Write a parser.", "Explain asyncio."]


def test_unusable_prompts_and_unknown_drafters_are_refused_before_any_job(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n{not json\n")
    code, _, err = kd("drafter", "doctor", "v3", "--prompts", str(empty), *FAST)
    assert code == 2 and "--prompts" in err and "no usable prompt" in err
    code, _, err = kd("drafter", "doctor", "nope", *FAST)
    assert code == 2 and "unknown drafter(s) nope" in err
    code, _, err = kd("drafter", "doctor", "ngram", *FAST)
    assert code == 2 and "model-free methods have nothing to replay" in err
    jobs = json.loads(testcluster.kubectl("-n", namespace, "get", "jobs", "-o", "json"))["items"]
    assert jobs == []
