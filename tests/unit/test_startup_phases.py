"""The start-up phase table read from vLLM's own log lines: on fixtures written from the pinned
GPU code paths' format strings (tests/fixtures/startup/README.md) and on a real CPU engine's log.
The pipeline tier parses a live server's log too (tests/pipeline/test_drafter_swap.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from kimideploy.formats.startup_phases import PHASES, StartupPhases, in_progress, parse

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "startup"


def lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_a_gpu_start_on_eight_ranks_reads_as_its_phases_from_the_slowest_rank() -> None:
    table = parse(lines("gpu-v1-tp8-cold.log"), started_at=at("2026-12-07T10:00:00"),
                  ready_at=at("2026-12-07T10:05:22"))  # fmt: skip
    got = {p.name: p.seconds for p in table.phases}
    assert list(got) == list(PHASES)
    assert got == {
        "container and imports": 41.0,
        "weights read": 121.0,  # the slowest of the eight ranks: 118.42 + 7 x 0.37
        "weight processing": 20.0,  # the slowest rank's "Model loading took" minus its read
        "torch.compile": 61.9,
        "profiling and KV cache": 35.3,  # init engine 131.20 - compile 61.88 - capture 34
        "graph capture": 34.0,
        "API server ready": 8.2,
    }
    assert table.total_s == 322.0
    assert abs(table.total_s - table.accounted_s) < 1.0
    assert table.compile_cache == "cold"
    assert table.reached == "API server ready"
    assert {p.source for p in table.phases if p.name == "weights read"} == {"vLLM"}


def test_a_warm_compile_cache_is_named_and_vllms_own_times_suffice() -> None:
    table = parse(lines("gpu-v2-tp4-warm.log"), started_at=at("2026-12-07T11:00:00"),
                  ready_at=at("2026-12-07T11:02:27"))  # fmt: skip
    assert table.compile_cache == "warm"
    assert table.seconds("torch.compile") == 13.9
    assert table.seconds("weights read") == 50.2
    assert table.seconds("container and imports") == 37.0
    assert table.total_s == 147.0
    # vLLM's whole-second timestamps: within two seconds of the total.
    assert abs(table.total_s - table.accounted_s) <= 2.0


def test_the_table_round_trips_through_a_record_and_prints_a_line_a_phase() -> None:
    table = parse(lines("gpu-v1-tp8-cold.log"), started_at=at("2026-12-07T10:00:00"),
                  ready_at=at("2026-12-07T10:05:22"))  # fmt: skip
    assert StartupPhases.from_dict(table.to_dict()) == table
    text = table.lines()
    assert text[0].split() == ["container", "and", "imports", "41.0", "s", "(log", "times)"]
    assert any("total, container start to Ready" in line for line in text)
    assert "  compile cache: cold" in text


@pytest.mark.parametrize(
    ("upto", "phase"),
    [
        (0, None),
        (1, "container and imports"),
        (3, "weights read"),  # the first rank said it is loading
        (12, "weight processing"),  # the first "Loading weights took"
        (20, "profiling and KV cache"),  # every rank has its model
        (27, "torch.compile"),  # "Starting torch.compile"
        (29, "torch.compile"),  # compiling a graph (a cold cache)
        (33, "profiling and KV cache"),  # graphs captured, the engine not yet initialised
        (34, "API server ready"),
    ],
)
def test_a_start_up_still_going_says_which_phase_it_is_in(upto: int, phase: str | None) -> None:
    assert in_progress(lines("gpu-v1-tp8-cold.log")[:upto]) == phase


def test_a_log_that_stops_before_the_engine_is_up_says_so() -> None:
    table = parse(lines("gpu-v1-tp8-cold.log")[:20], started_at=at("2026-12-07T10:00:00"))
    assert [p.name for p in table.phases] == [
        "container and imports", "weights read", "weight processing"]  # fmt: skip
    assert table.total_s is None
    assert table.notes == ("the engine has not finished starting",)
