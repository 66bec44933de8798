"""`run calibrate` on the real control plane: the planned revisions and bench Jobs, the stored
calibration, resume after a failed k, the serving revision restored, predictions switching.

Bench results arrive as a real bench pod delivers them (the `result` line in its log, served by
KWOK): the calibration benches' levels are what a cluster with the step cost COST would measure.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.integration.conftest import harness
from tests.integration.test_gate import BENCH_PODS, FAST, QUICK_BENCH, bench_level, history

pytestmark = pytest.mark.integration
BASE = {1: 60.0, 8: 400.0}
COST = {(1, 1): 1.2, (1, 8): 1.5, (2, 1): 1.4, (2, 8): 2.1}
CALIBRATE = (
    "run", "calibrate", "--image", "vllm-0.32-kimi", "--drafter", "v3", "--k", "1,2",
    "--acceptance-length", "1.5,2,3", "--concurrency", "1,8", "--set", QUICK_BENCH, "--yes",
    "--poll", "0.2", "--scheduling-grace", "2",
)  # fmt: skip


def write_log(path: Path, levels: list[dict[str, Any]]) -> Path:
    result = {"event": "result", "stage": "bench", "run_id": "x", "levels": levels}
    return harness.write_container_log(path, ["(human line)", json.dumps(result)])


def calibration_logs(where: Path) -> dict[str, Path]:
    files = {"none": write_log(where / "none.log", [
        bench_level(p, c, BASE[c], None) for p in ("chat", "reasoning") for c in BASE
    ])}  # fmt: skip
    for k, lengths in ((1, (1.5, 2.0)), (2, (1.5, 2.0, 3.0))):
        levels = []
        for length in lengths:
            for p in ("chat", "reasoning"):
                for c in BASE:
                    level = bench_level(p, c, round(BASE[c] * length / COST[(k, c)], 3), 0.5)
                    level.update(mean_acceptance_length=length, synthetic_acceptance_length=length)
                    levels.append(level)
        files[str(k)] = write_log(where / f"k{k}.log", levels)
    files["no-result"] = harness.write_container_log(where / "broken.log", ["(human line)"])
    return files


def by_k(files: dict[str, Path], broken: set[str]) -> Callable[[dict[str, Any]], harness.PodChoice]:
    """Each bench pod gets the log of the k it measures; a `broken` k's pod prints no result line
    (deterministic, unlike failing a pod that may already have finished)."""

    def choose(pod: dict[str, Any]) -> harness.PodChoice:
        k = pod["metadata"]["labels"].get("kimideploy.io/calibration-k", "none")
        return (files["no-result"] if k in broken else files[k]), {}

    return choose


def test_calibrate_measures_stores_resumes_and_restores_what_served(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KIMIDEPLOY_CALIBRATION_CACHE", str(tmp_path / "calibrations"))
    # Revision 1 serves the team's vLLM 0.16 stack: calibrating 0.32 needs a baseline load.
    text = (REPO / "kimideploy.yaml").read_text()
    anchor = "whatever the drafter.\n      serve: vllm-0.32-kimi\n"
    old_stack = tmp_path / "old-stack.yaml"
    old_stack.write_text(text.replace(anchor, anchor.replace("0.32", "0.16"), 1))
    assert kd("up", "serve", "--drafter", "none", *FAST, config=old_stack)[0] == 0

    code, _, err = kd(*[a if a != "vllm-0.32-kimi" else "vllm-0.16-kimi" for a in CALIBRATE])
    assert code == 2, err
    assert "vllm-0.16-kimi (vLLM 0.16.0), which has no synthetic rejection sampling" in err
    assert "--image vllm-0.32-kimi" in err
    assert len(history(kd)) == 1  # refused before anything was created
    wide = [a if a != "1,8" else "1,4096" for a in CALIBRATE]
    code, _, err = kd(*wide)
    assert code == 2 and "--concurrency 4096: above serve.max_num_seqs" in err
    assert len(history(kd)) == 1

    files = calibration_logs(tmp_path)
    with harness.PodHooks(testcluster, namespace, BENCH_PODS, by_k(files, {"2"})):
        code, _, err = kd(*CALIBRATE)
    assert code == 4, err
    assert "3 model load(s) (baseline, k=1, k=2, each up to the startup budget" in err
    assert "acceptance lengths k=1 at 1.5, 2.0; k=2 at 1.5, 2.0, 3.0" in err
    assert "calibration stopped: k=2: bench run" in err and "without a result line" in err
    assert "measured so far: k=[1]" in err
    rows = history(kd)
    assert [(r["drafter"], r["status"]) for r in rows] == [
        ("none", "superseded"), ("none", "superseded"), ("v3", "superseded"),
        ("v3", "rolled-back"), ("none", "deployed"),
    ]  # fmt: skip
    assert rows[-1]["note"].startswith("restored after calibration")

    with harness.PodHooks(testcluster, namespace, BENCH_PODS, by_k(files, set())):
        code, out, err = kd(*CALIBRATE)
    assert code == 0, err
    assert "1 model load(s) (k=2, each up to the startup budget" in err
    assert "at the baseline's tokens/s; resuming, k=[1] already measured" in err
    assert "at c=8 no k pays below acceptance length 1.50" in out
    rows = history(kd)
    assert [(r["drafter"], r["status"]) for r in rows[5:]] == [
        ("v3", "rolled-back"), ("none", "deployed"),
    ]  # fmt: skip
    deployment = json.loads(
        testcluster.kubectl("-n", namespace, "get", "deployment", "kimi-k25-serve", "-o", "json")
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--speculative-config" not in container["args"]
    assert rows[0]["image"] in container["image"]  # revision 1's vLLM 0.16 is back
    assert not any(e["name"] == "VLLM_SERVER_DEV_MODE" for e in container.get("env", []))

    code, out, _ = kd("calibrate", "show", "-o", "json")
    assert code == 0
    shown = json.loads(out)
    costs = {(p["k"], p["concurrency"]) for p in shown["points"]}
    assert costs == set(COST) and shown["complete"] is True
    assert shown["table"][0]["break-even k=2"] == pytest.approx(1.4, abs=0.01)
    code, _, err = kd(*CALIBRATE)
    assert code == 0 and "nothing to do (--again measures it anew)" in err
    # --again measures next to the stored one, which stays (and predicts) until the new is done.
    with harness.PodHooks(testcluster, namespace, BENCH_PODS, by_k(files, {"1"})):
        code, _, err = kd(*CALIBRATE, "--again")
    assert code == 4, err
    stored = testcluster.kubectl("-n", namespace, "get", "configmaps", "-l",
                                 "kimideploy.io/calibration=rtx6000", "-o", "name").split()  # fmt: skip
    assert len(stored) == 2 and any(name.endswith("-1") for name in stored), stored

    # Predictions: the stored calibration was measured on vLLM 0.32, so rtx6000 moved back to
    # 0.16 keeps the prior and says why; as configured (0.32) it predicts with it.
    code, out, err = kd("up", "serve", "--drafter", "v3", "--dry-run", config=old_stack)
    assert code == 2 and "serve stack: speculation cannot pay" in err  # as `up` refuses it
    assert "prior for 8x RTX PRO 6000" in out and "so not used" in out
    moved = tmp_path / "moved.yaml"
    moved.write_text(text)
    code, out, _ = kd("up", "serve", "--drafter", "v3", "--dry-run", config=moved)
    assert code == 0, out
    assert "step cost" in out and "measured on 20" in out
    # status and the gate judge a served drafter's acceptance against the measured break-even.
    assert kd("up", "serve", "--drafter", "v3", *FAST, config=moved)[0] == 0
    code, out, _ = kd("status", "-o", "json")
    assert code == 0
    serving = json.loads(out)["serving"]
    assert serving["break_even_from"].startswith("measured on 20"), serving
    # v3 drafts k=3, which was not measured: C(3, 1) = 1 + 3 a with a fitted through k=1 and k=2
    # at c=1, and the break-even rate (C - 1) / k is then a itself (the default would be 0.1433).
    per_token = (1 * (COST[(1, 1)] - 1) + 2 * (COST[(2, 1)] - 1)) / (1 + 4)
    assert serving["break_even_rate"] == pytest.approx(per_token, abs=0.002)
    # A speculative revision serving before a calibration is what comes back after it.
    serving_before = history(kd)[-1]["revision"]
    small = [*CALIBRATE[:7], "1", "--acceptance-length", "1.5", *CALIBRATE[10:]]
    with harness.PodHooks(testcluster, namespace, BENCH_PODS, by_k(files, set())):
        code, _, err = kd(*small)
    assert code == 0, err
    assert "1 model load(s) (k=1," in err  # the stored baseline is reused: no baseline load
    assert f"restored revision {serving_before} (v3), which served before" in err
    back = json.loads(
        testcluster.kubectl("-n", namespace, "get", "deployment", "kimi-k25-serve", "-o", "json")
    )["spec"]["template"]["spec"]["containers"][0]
    spec = json.loads(back["args"][back["args"].index("--speculative-config") + 1])
    assert "rejection_sample_method" not in spec and spec["num_speculative_tokens"] == 3
    assert "--worker-extension-cls" not in back["args"]
    # Before training: what the drafter must reach here to pass the gate, from the measured cost
    # (the serve release goes first: on this one-host cluster it holds every GPU).
    assert kd("down", "serve", "--yes")[0] == 0
    quick = "train.pod_annotations=" + json.dumps({"kimideploy.test/run-duration": "1s"})
    code, _, err = kd("run", "train", "--set", quick, "--poll", "0.2", config=moved)
    assert code == 0, err
    assert "acceptance needed: to pass the gate (" in err and "measured on 20" in err
