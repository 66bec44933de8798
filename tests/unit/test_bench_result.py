"""One bench result, one typed value (formats/bench_result.py): what the bench pod writes reads
back as it was written, and a result of another shape is refused naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kimideploy.formats.bench_result import BenchLevel, BenchResult, BenchResultError


def pod_level(**changes: Any) -> dict[str, Any]:
    """A level as workloads/bench.py writes it (every key it always writes)."""
    written = {
        "prompt_set": "code", "concurrency": 4, "requests": 20, "failed": 0,
        "output_tokens": 2400, "seconds": 12.5, "output_tokens_per_s": 192.0,
        "ttft_p50_s": 0.21, "ttft_p99_s": 0.9, "tpot_p50_s": 0.05, "tpot_p99_s": 0.08,
        "metrics": "requests", "acceptance_rate": 0.74, "mean_acceptance_length": 3.22,
        "per_position_acceptance": [0.9, 0.75, 0.57], "per_position_basis": "exact",
        "scraped_acceptance_rate": 0.74, "errors": [],
    }  # fmt: skip
    return {**written, **changes}


def pod_result(*levels: dict[str, Any], **changes: Any) -> dict[str, Any]:
    written = {
        "run_id": "bench-1", "drafter": "good", "endpoint": "http://tiny-serve:8000",
        "model": "tiny", "max_tokens": 128, "levels": list(levels), "baseline": None,
        "num_speculative_tokens": None,
    }  # fmt: skip
    return {**written, **changes}


def test_what_the_pod_writes_reads_back_as_written() -> None:
    plain = pod_result(pod_level(), pod_level(concurrency=8, metrics="unavailable"))
    compared = pod_result(pod_level(speedup=1.8, baseline_tokens_per_s=106.7), baseline="/r.json")
    synthetic = pod_result(
        pod_level(synthetic_acceptance_length=2.5, synthetic_rates=[1.0, 0.5, 0.0]),
        num_speculative_tokens=3,
    )
    for written in (plain, compared, synthetic):
        read = BenchResult.from_dict(json.loads(json.dumps(written)))
        assert read.as_dict() == written
        assert json.dumps(read.as_dict(), sort_keys=True) == json.dumps(written, sort_keys=True)
    read = BenchResult.from_dict(plain)
    assert read.covers([("code", 4), ("code", 8)]) and not read.covers([("chat", 4)])
    assert read.level(("code", 8)) == read.levels[1]
    assert [lv.counted_by for lv in read.levels] == ["requests", None]


def test_the_result_event_reads_with_its_event_keys_left_out() -> None:
    event = {"event": "result", "stage": "bench", **pod_result(pod_level())}
    assert BenchResult.from_dict(event).as_dict() == pod_result(pod_level())


def test_a_level_the_pod_builds_is_the_level_that_reads_back() -> None:
    level = BenchLevel(prompt_set="chat", concurrency=1, output_tokens_per_s=50.0, errors=("x",))
    assert BenchLevel.from_dict(level.as_dict()) == level
    assert "speedup" not in level.as_dict() and level.as_dict()["errors"] == ["x"]


@pytest.mark.parametrize(
    ("written", "message"),
    [
        ([], "the result is list, not an object"),
        ({"levels": "none"}, "result.levels is not a list of levels"),
        ({"levels": [3]}, r"result.levels\[0\] is int, not an object"),
        ({"levels": [pod_level(prompt_set=None)]}, r"result.levels\[0\]: prompt_set is None"),
        (
            {"levels": [pod_level(output_tokens_per_s=-1)]},
            r"result.levels\[0\] \(code c=4\): output_tokens_per_s is -1.0",
        ),
        ({"levels": [pod_level(concurrency="4")]}, "concurrency is '4', not a whole number"),
        ({"levels": [pod_level(concurrency=None)]}, "concurrency is missing"),
        ({"levels": [pod_level(failed=True)]}, "failed is True, not a whole number"),
        ({"levels": [pod_level(acceptance_rate="high")]}, "acceptance_rate is 'high', not a num"),
        (
            {"levels": [pod_level(per_position_acceptance=[0.5, "x"])]},
            "per_position_acceptance is .* not a list of numbers",
        ),
        ({"levels": [], "drafter": 3}, "result: drafter is 3, not text"),
    ],
)
def test_a_result_of_another_shape_is_refused_naming_the_field(written: Any, message: str) -> None:
    with pytest.raises(BenchResultError, match=message):
        BenchResult.from_dict(written)
