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
