"""Shared fixtures: the example project, and edited copies of it for error cases."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.loading import LoadedProject, load_project
from tests.timing import Timing

# What scripts/test exports (see there why), for a pytest started directly.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The test control plane and the emulated pods pull nothing the example's placeholder pins name;
# tests/unit/test_placeholders.py takes this away to prove the refusal.
os.environ["KIMIDEPLOY_ALLOW_PLACEHOLDERS"] = "1"

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "kimideploy.yaml"


@pytest.fixture(scope="session", autouse=True)
def private_calibration_copies(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Commands leave a local copy of the cluster's calibrations; tests keep theirs to themselves
    (and never predict with a copy a real `run calibrate` left in the home cache)."""
    os.environ["KIMIDEPLOY_CALIBRATION_CACHE"] = str(tmp_path_factory.mktemp("calibrations"))


@pytest.fixture(scope="session")
def observability_binaries() -> tuple[Path, Path]:
    """(prometheus, kube-state-metrics), built by scripts/build-prometheus on first use; skipped
    without them unless a CI switch requires the tier that uses them."""
    from tests import observability

    try:
        return observability.binaries()
    except observability.UnavailableError as exc:
        required = ("KIMIDEPLOY_REQUIRE_TESTCLUSTER", "KIMIDEPLOY_REQUIRE_PIPELINE")
        if any(os.environ.get(name) == "1" for name in required):
            pytest.fail(f"prometheus required: {exc}")
        pytest.skip(f"prometheus unavailable: {exc}")


@pytest.fixture(scope="session")
def example() -> LoadedProject:
    return load_project(EXAMPLE)


@pytest.fixture
def edited_config(tmp_path: Path) -> Callable[..., Path]:
    """Write the example with textual edits (each `old` must occur exactly once)."""

    def make(*edits: tuple[str, str]) -> Path:
        text = EXAMPLE.read_text()
        for old, new in edits:
            assert text.count(old) == 1, f"edit target not unique: {old!r}"
            text = text.replace(old, new)
        path = tmp_path / "kimideploy.yaml"
        path.write_text(text)
        return path

    return make


TIMING = Timing()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    TIMING.add(report.nodeid, report.duration)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.section("where the time went")
    for line in TIMING.lines():
        terminalreporter.write_line(line)
