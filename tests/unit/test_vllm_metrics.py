"""Acceptance from two scrapes in the exact exposition of the pinned vLLM (fixtures captured by
scripts/capture-vllm-metrics from vLLM 0.16.0's own SpecDecodingProm)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimideploy.vllm_metrics import acceptance, parse

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-metrics"


def test_acceptance_over_the_benchmark_window() -> None:
    before = (FIXTURES / "0.16.0-before.txt").read_text()
    after = (FIXTURES / "0.16.0-after.txt").read_text()
    result = acceptance(before, after)
    assert result is not None
    assert (result.drafts, result.draft_tokens, result.accepted) == (2000, 6000, 2760)
    assert result.rate == pytest.approx(2760 / 6000)
    assert result.mean_acceptance_length == pytest.approx(1 + 2760 / 2000)
    assert result.per_position_rate == pytest.approx((0.65, 0.45, 0.28))


def test_no_counters_means_no_drafter() -> None:
    assert acceptance("", "# nothing\nvllm:num_requests_running 1.0\n") is None


def test_engines_are_summed() -> None:
    text = ('vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'
            'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0\n')  # fmt: skip
    assert sum(parse(text)["vllm:spec_decode_num_drafts_total"].values()) == 15.0
