"""`run bench --drafters` on the real control plane: one serve revision per candidate, the number
of loads said first, refusals before anything is created, a failed candidate restoring what
served and the same command resuming without loading the measured ones again, and the table
with the method to serve per concurrency.

Bench results arrive as a real bench pod delivers them (the `result` line in its log, served by
KWOK), chosen by the pod's drafter label: what a cluster would measure for each candidate.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import harness
from tests.integration.test_calibrate import write_log
from tests.integration.test_gate import BENCH_PODS, FAST, QUICK_BENCH, bench_level, history

pytestmark = pytest.mark.integration
BASE = {1: 60.0, 8: 400.0}
# tokens/s as a multiple of no drafter's, and the acceptance rate vLLM counted, per candidate:
# n-gram pays a little at c=1 only, EAGLE-3 (v3) pays at c=1 and loses at c=8.
MEASURED = {"ngram": ({1: 1.08, 8: 0.97}, 0.3), "v3": ({1: 1.6, 8: 0.9}, 0.7)}
BAKEOFF = ("run", "bench", "--drafters", "none,ngram,v3", "--concurrency", "1,8",
           "--set", QUICK_BENCH, "--yes", "--poll", "0.2", "--scheduling-grace", "2")  # fmt: skip


def logs(where: Path) -> dict[str, Path]:
    files = {"none": write_log(where / "none.log", [
        bench_level(p, c, BASE[c], None) for p in ("chat", "reasoning") for c in BASE
    ])}  # fmt: skip
    for name, (factor, rate) in MEASURED.items():
        levels = [bench_level(p, c, round(BASE[c] * factor[c], 3), rate)
                  for p in ("chat", "reasoning") for c in BASE]  # fmt: skip
        files[name] = write_log(where / f"{name}.log", levels)
    files["no-result"] = harness.write_container_log(where / "broken.log", ["(human line)"])
    return files


def by_drafter(files: dict[str, Path], broken: set[str]) -> Callable[[dict[str, Any]], Any]:
    def choose(pod: dict[str, Any]) -> harness.PodChoice:
        name = pod["metadata"]["labels"]["kimideploy.io/drafter"]
        return (files["no-result"] if name in broken else files[name]), {}

    return choose


def test_the_bakeoff_measures_each_candidate_resumes_and_restores_what_served(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    assert kd("up", "serve", "--drafter", "v1", *FAST)[0] == 0  # revision 1 serves v1

    # Refused before anything is created: suffix decoding on the team's vLLM 0.16 image.
    code, _, err = kd("run", "bench", "--drafters", "none,suffix", "--image", "vllm-0.16-kimi",
                      "--yes")  # fmt: skip
    assert code == 2 and "suffix decoding needs Arctic Inference" in err, err
    code, _, err = kd("run", "bench", "--drafters", "none,ngram", "--drafter", "v3")
    assert code == 2 and "--drafters is the bench bake-off" in err
    # A/B rounds need drafters the running server can swap among themselves: v2 and v3 are fed
    # other target layers (and draft 5 and 3 tokens); n-gram has no weights to swap.
    code, _, err = kd("run", "bench", "--drafters", "v2,v3,ngram", "--rounds", "3", "--yes")
    assert code == 2, err
    assert "--rounds 3: no two candidates can be swapped into one running server" in err
    assert "v2: more than the drafter changes (spec.layers.convention" in err
    assert "ngram: its server cannot swap drafters" in err
    assert len(history(kd)) == 1

    files = logs(tmp_path)
    with harness.PodHooks(testcluster, namespace, BENCH_PODS, by_drafter(files, {"v3"})):
        code, _, err = kd(*BAKEOFF)
    assert code == 4, err
    assert ("bake-off on rtx6000: 3 revision(s) (none, ngram, v3; a model load each unless it "
            "swaps the drafter, each up to the startup") in err  # fmt: skip
    assert "bake-off stopped: bench run" in err and "without a result line" in err
    assert "restored revision 1 (v1), which served before" in err
    assert "measured candidates (ngram, none) are not loaded again" in err
    rows = history(kd)
    assert [(r["drafter"], r["status"]) for r in rows] == [
        ("v1", "superseded"), ("none", "superseded"), ("ngram", "superseded"),
        ("v3", "rolled-back"), ("v1", "deployed"),
    ]  # fmt: skip

    with harness.PodHooks(testcluster, namespace, BENCH_PODS, by_drafter(files, set())):
        code, out, err = kd(*BAKEOFF)
    assert code == 0, err
    assert "1 revision(s) (v3; a model load each unless it swaps the drafter, each up to" in err
    assert "measured before, not loaded again: none, ngram" in err
    assert "recommended per concurrency" in out and "c=1: v3, c=8: none" in out
    rows = history(kd)
    assert [(r["drafter"], r["status"]) for r in rows[5:]] == [
        ("v3", "rolled-back"), ("v1", "deployed"),
    ]  # fmt: skip

    code, out, _ = kd(*BAKEOFF, "-o", "json")
    assert code == 0
    document = json.loads(out)["bakeoff"]
    assert document["recommended"] == {"1": "v3", "8": "none"} and document["unmeasured"] == {}
    speedups = {(r["candidate"], r["prompt_set"], r["concurrency"]): r["speedup"]
                for r in document["rows"]}  # fmt: skip
    assert speedups[("ngram", "chat", 1)] == pytest.approx(1.08)
    assert speedups[("v3", "reasoning", 8)] == pytest.approx(0.9)
    assert len(history(kd)) == 7  # everything was measured before: nothing was deployed
    # The non-speculative run is stored as the gate's baseline.
    code, out, _ = kd("bench", "list", "-o", "json")
    assert code == 0 and {"none", "ngram", "v3"} <= {r["drafter"] for r in json.loads(out)}
