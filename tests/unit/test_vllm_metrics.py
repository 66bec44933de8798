"""Acceptance from two scrapes in the exact exposition of the pinned vLLM (fixtures captured by
scripts/capture-vllm-metrics from vLLM 0.16.0's own SpecDecodingProm)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from kimideploy.formats.vllm_metrics import (
    BASIS_APPROXIMATE,
    BASIS_FULL_LENGTH,
    DRAFTS,
    Samples,
    acceptance,
    from_requests,
    parse,
    parse_with_client,
)

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
    assert result.per_position_basis == BASIS_FULL_LENGTH  # 6000 draft tokens = 2000 drafts x 3


def test_no_counters_means_no_drafter() -> None:
    assert acceptance("", "# nothing\nvllm:num_requests_running 1.0\n") is None


def test_engines_are_summed() -> None:
    text = ('vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'
            'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0\n')  # fmt: skip
    assert sum(parse(text)["vllm:spec_decode_num_drafts_total"].values()) == 15.0


ESCAPED = ("0.32.0-escaped-before.txt", "0.32.0-escaped-after.txt")


@pytest.mark.parametrize("reader", [parse, parse_with_client], ids=["light", "prometheus_client"])
def test_a_model_name_with_quotes_braces_and_a_backslash_is_read_over_two_engines(
    reader: Callable[[str], Samples],
) -> None:
    """Captured from vLLM 0.32's SpecDecodingProm by scripts/capture-vllm-metrics; a label regex
    that stops at the first `}` read none of these samples."""
    before, after = ((FIXTURES / name).read_text() for name in ESCAPED)
    result = acceptance(before, after, reader)
    assert result is not None
    assert (result.drafts, result.draft_tokens, result.accepted) == (2500, 7500, 3360)
    assert result.per_position == (1600, 1100, 660)
    [labels, _] = reader(after)[DRAFTS]
    assert dict(labels)["model_name"] == 'kimi-k2.5 "int4" {a,b}\\x'


@pytest.mark.parametrize("name", ["0.16.0-before.txt", "0.16.0-after.txt", *ESCAPED])
def test_both_readers_agree_on_every_captured_exposition(name: str) -> None:
    text = (FIXTURES / name).read_text()
    assert parse(text) == parse_with_client(text)


def test_both_readers_agree_on_label_values_the_client_library_wrote() -> None:
    """Many generated values of the characters exposition escapes or that end a naive match,
    written by prometheus_client (what vLLM's /metrics is) and read back by both readers."""
    import prometheus_client

    generator = random.Random(7)
    alphabet = 'ab "\\{},=\n}#\t'
    registry = prometheus_client.CollectorRegistry()
    counter = prometheus_client.Counter(
        "vllm:spec_decode_num_drafts", "drafts", ["model_name", "engine"], registry=registry
    )
    wanted = {}
    for engine in range(300):
        value = "".join(generator.choice(alphabet) for _ in range(generator.randint(0, 12)))
        counter.labels(value, str(engine)).inc(engine + 1)
        wanted[(("engine", str(engine)), ("model_name", value))] = float(engine + 1)
    text = prometheus_client.generate_latest(registry).decode()
    light, client = parse(text), parse_with_client(text)
    assert light == client
    assert light[DRAFTS] == wanted


def test_lines_that_are_not_samples_are_skipped() -> None:
    text = (
        'unterminated{a="x 1\n'
        'missing_value{a="x"}\n'
        'glued{a="x"}2\n'
        'spaced{ a = "x" , b="y" , } 3 1700000000000\n'
        "bare 4e2\n"
    )
    assert parse(text) == {"spaced": {(("a", "x"), ("b", "y")): 3.0}, "bare": {(): 400.0}}


def test_requests_own_acceptance_sums_to_the_counters_figures() -> None:
    """Two responses' `metrics.speculative_decoding` (vLLM 0.32's summary level, k=3): 10 verify
    steps accepting 0,1,2,3 drafts 1,2,3,4 times, and 5 steps accepting all 3."""
    reports = [
        {"acceptance_histogram": [1, 2, 3, 4], "num_spec_steps": 10, "num_draft_tokens": 30,
         "num_accepted_draft_tokens": 20, "num_spec_tokens": 3, "mean_acceptance_length": 3.0},
        {"acceptance_histogram": [0, 0, 0, 5], "num_spec_steps": 5, "num_draft_tokens": 15,
         "num_accepted_draft_tokens": 15, "num_spec_tokens": 3, "mean_acceptance_length": 4.0},
    ]  # fmt: skip
    result = from_requests(reports)
    assert result is not None
    assert (result.drafts, result.draft_tokens, result.accepted) == (15, 45, 35)
    assert result.per_position == (14, 12, 9)  # j > 0, j > 1, j > 2
    assert sum(result.per_position) == result.accepted
    assert result.mean_acceptance_length == pytest.approx(1 + 35 / 15)
    assert from_requests([]) is None


def test_drafts_of_varying_length_are_said_to_be_approximate() -> None:
    """Suffix decoding drafts up to k tokens and often fewer: vLLM 0.32's per-request report of
    10 steps drafting 14 tokens at k=3 cannot say which positions each draft reached."""
    [report] = [{"acceptance_histogram": [4, 4, 2, 0], "num_spec_steps": 10,
                 "num_draft_tokens": 14, "num_accepted_draft_tokens": 8, "num_spec_tokens": 3}]  # fmt: skip
    result = from_requests([report])
    assert result is not None and result.per_position_basis == BASIS_APPROXIMATE
    assert result.per_position_rate == pytest.approx((0.6, 0.2, 0.0))  # over all 10 drafts
