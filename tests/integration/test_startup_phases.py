"""A start-up by phase on the real control plane: KWOK serves a start-up log written from the pinned
GPU code paths' format strings (tests/fixtures/startup) as the serve pod's and an extraction
pod's log, each line with its kubelet time; `up` prints the table and keeps it in the record,
`status` and `-o json` show it, and a run that starts an engine ends with its table. The table's
own arithmetic is tests/unit/test_startup_phases.py; a live CPU engine's is the pipeline tier's."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.integration.conftest import harness, weights_synced
from tests.integration.test_runs_and_errors import annotations

pytestmark = pytest.mark.integration
FAST = ("--yes", "--poll", "0.2", "--scheduling-grace", "2")
GPU_LOG = REPO / "tests" / "fixtures" / "startup" / "gpu-v1-tp8-cold.log"
STATED = {  # what vLLM itself printed in the fixture: the slowest rank's figures
    "weights read": 121.0,
    "weight processing": 20.0,
    "torch.compile": 61.9,
    "profiling and KV cache": 35.3,
    "graph capture": 34.0,
}


def served_log(testcluster: harness.TestCluster, namespace: str, where: Path) -> None:
    lines = GPU_LOG.read_text().splitlines()
    harness.serve_logs(testcluster, namespace, harness.write_timed_container_log(where, lines))


def stated(table: dict[str, Any]) -> dict[str, float]:
    return {p["name"]: p["seconds"] for p in table["phases"] if p["source"] == "vLLM"}


def test_up_prints_keeps_and_shows_the_new_pods_start_up_by_phase(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    served_log(testcluster, namespace, tmp_path / "serve.log")
    code, out, err = kd("up", "serve", "--drafter", "none", "-o", "json", *FAST)
    assert code == 0, err
    assert "start-up by phase (vLLM's own log lines):" in err
    assert "weights read" in err and "121.0 s  (vLLM)" in err
    assert "compile cache: cold" in err
    document = json.loads(out)
    assert (document["change"], stated(document["startup"])) == ("rollout", STATED)
    code, out, _ = kd("status", "-o", "json")
    assert code == 0
    shown = json.loads(out)["startup"]
    assert shown["revision"] == 1 and stated(shown) == STATED
    code, out, _ = kd("status")
    assert code == 0 and "Start-up of the serving pods (revision 1):" in out
    assert "graph capture" in out


def test_an_extraction_run_ends_with_its_engines_start_up(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    weights_synced(testcluster, namespace)
    served_log(testcluster, namespace, tmp_path / "extract.log")
    b300 = ("--cluster", "b300", "--poll", "0.3", "-o", "json")
    code, out, err = kd("run", "extract", *b300, "--set", annotations(run_duration="1s"))
    assert code == 0, err
    assert "engine start-up by phase (vLLM's own log lines):" in err
    assert stated(json.loads(out)["run"]["startup"]) == STATED
