"""The time table scripts/test ends with: both pytest sessions' tests, and the build steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.timing import Timing


def test_the_last_session_sums_the_tests_of_the_earlier_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    timings = tmp_path / "timings.jsonl"
    earlier = [
        {"step": "build: test control plane (Go)", "start": 100.0, "end": 800.0, "rc": 0},
        {"test": "tests/integration/test_a.py::test_slow", "seconds": 40.0, "pid": 1},
        {"test": "tests/integration/test_a.py::test_quick", "seconds": 2.0, "pid": 1},
        {"step": "tests: unit, render, integration", "start": 800.0, "end": 850.0, "rc": 0},
    ]
    timings.write_text("".join(json.dumps(r) + "\n" for r in earlier) + "not json\n")
    monkeypatch.setenv("KIMIDEPLOY_TIMINGS", str(timings))
    timing = Timing()
    timing.add("tests/pipeline/test_b.py::test_long", 90.0)
    timing.add("tests/pipeline/test_b.py::test_long", 10.0)  # setup and call of one test

    assert timing.tiers() == {"integration": 42.0, "pipeline": 100.0}
    text = "\n".join(timing.lines())
    assert "build: test control plane (Go)" in text and "tests: unit, render, integration" in text
    slowest = text[text.index("slowest") :].splitlines()[1:]
    assert [line.split()[1] for line in slowest] == [
        "tests/pipeline/test_b.py::test_long",
        "tests/integration/test_a.py::test_slow",
        "tests/integration/test_a.py::test_quick",
    ]
    # This session's own records are in the file too, counted once.
    assert sum("test_long" in line for line in timings.read_text().splitlines()) == 2
    closing = "\n".join(timing.lines(session=False))  # scripts/test's table after every session
    assert "this pytest session" not in closing and "tier pipeline" in closing


def test_each_step_shows_its_cpu_and_the_run_how_busy_the_cores_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    timings = tmp_path / "timings.jsonl"
    steps = [
        {"step": "build: Go", "start": 0.0, "end": 100.0, "rc": 0, "cpu": 190.0},
        {"step": "tests: waiting", "start": 0.0, "end": 100.0, "rc": 0, "cpu": 10.0},
        {"step": "recorded before cpu was", "start": 0.0, "end": 50.0, "rc": 1},
    ]
    timings.write_text("".join(json.dumps(r) + "\n" for r in steps))
    monkeypatch.setenv("KIMIDEPLOY_TIMINGS", str(timings))
    monkeypatch.setattr("tests.timing.os.cpu_count", lambda: 2)
    monkeypatch.setattr("tests.timing.time.time", lambda: 100.0)

    lines = Timing().lines(session=False)
    go = next(line for line in lines if line.startswith("build: Go"))
    assert go.split()[-2:] == ["190", "1.90"]
    waiting = next(line for line in lines if line.startswith("tests: waiting"))
    assert waiting.split()[-2:] == ["10", "0.10"]
    older = next(line for line in lines if line.startswith("recorded before"))
    assert older.split()[-1] == "1"  # its exit code, and no cpu columns
    assert "cpu used by the steps: 200 s of 200 s on 2 cores (100%)" in lines
