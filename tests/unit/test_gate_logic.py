"""The gate's rules (which baseline, keep or roll back), the live watch, and the speedup chart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kimideploy.cluster.bench_results import StoredBench
from kimideploy.cluster.records import ReleaseRecord, _labels
from kimideploy.config.gate import WatchSettings
from kimideploy.errors import UsageError
from kimideploy.formats.bench_result import BenchResult
from kimideploy.services.gate.bench_reports import speedup_series, write_chart
from kimideploy.services.gate.verdict import (
    GateMeasurementError,
    Verdict,
    judge,
    pick_baseline,
)
from kimideploy.services.release.watch import AcceptanceWatch
from tests.conftest import REPO

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
NEEDED = [("chat", 1), ("chat", 8)]


def level(c: int, tps: float, rate: float | None = None, failed: int = 0) -> dict[str, Any]:
    return {
        "prompt_set": "chat",
        "concurrency": c,
        "requests": 10,
        "failed": failed,
        "errors": ["URLError: timed out"] if failed else [],
        "output_tokens": 1000,
        "output_tokens_per_s": tps,
        "metrics": "scraped" if rate is not None else "unavailable",
        "acceptance_rate": rate,
        "mean_acceptance_length": None if rate is None else 1 + 3 * rate,
        "per_position_acceptance": None,
    }


def result(levels: list[dict[str, Any]]) -> BenchResult:
    """The bench pod's result event with these levels, read as the CLI reads it."""
    return BenchResult.from_dict({"levels": levels})


def stored(
    run_id: str,
    drafter: str = "none",
    hours_ago: float = 1,
    serve: str = "s1",
    bench: str = "b1",
    levels: list[dict[str, Any]] | None = None,
    cluster: str = "rtx6000",
) -> StoredBench:
    return StoredBench(
        release="kimi-k25-serve",
        run_id=run_id,
        drafter=drafter,
        cluster=cluster,
        image="img@sha256:1",
        revision=1,
        serve_fingerprint=serve,
        bench_fingerprint=bench,
        measured_at=(NOW - timedelta(hours=hours_ago)).strftime("%Y-%m-%dT%H:%M:%S%z"),
        result=result(levels if levels is not None else [level(1, 50), level(8, 300)]),
    )


def pick(runs: list[StoredBench], max_age_h: float = 72) -> tuple[StoredBench | None, str]:
    return pick_baseline(
        runs,
        cluster="rtx6000",
        serve_print="s1",
        bench_print="b1",
        needed=NEEDED,
        max_age_h=max_age_h,
        now=NOW,
    )


def test_the_newest_comparable_baseline_is_chosen() -> None:
    runs = [stored("old", hours_ago=10), stored("new", hours_ago=2), stored("v3", drafter="v3")]
    found, why = pick(runs)
    assert found is not None and found.run_id == "new"
    assert "baseline run new" in why and "2.0 h ago" in why


@pytest.mark.parametrize(
    ("runs", "reason"),
    [
        ([], "no non-speculative baseline has been measured on cluster rtx6000"),
        ([stored("a", cluster="b300")], "no non-speculative baseline has been measured"),
        ([stored("a", serve="s2")], "different serve configuration"),
        ([stored("a", bench="b2")], "other bench settings"),
        ([stored("a", levels=[level(1, 50)])], "covers every gated level (chat c=1, chat c=8)"),
        ([stored("a", hours_ago=100)], "is 100 h old, older than gate.baseline_max_age_h (72 h)"),
    ],
)
def test_a_baseline_that_does_not_compare_is_refused_with_the_reason(
    runs: list[StoredBench], reason: str
) -> None:
    found, why = pick(runs)
    assert found is None
    assert reason in why


def test_keep_needs_every_gated_level_to_pay() -> None:
    base = result([level(1, 50), level(8, 300)])
    keep, reason, rows = judge(result([level(1, 70, 0.6), level(8, 330, 0.6)]), base, NEEDED, 1.05)
    assert keep and reason == "at least 1.05x everywhere: chat c=1 1.40x, chat c=8 1.10x"
    assert [r["passed"] for r in rows] == [True, True]
    keep, reason, rows = judge(result([level(1, 70, 0.6), level(8, 270, 0.6)]), base, NEEDED, 1.05)
    assert not keep and reason == "below 1.05x at chat c=8 0.90x"
    verdict = Verdict("rollback", reason, 1.05, rows)
    assert verdict.worst_speedup == 0.9
    assert (
        verdict.summary()
        == "rolled back (worst 0.90x, needed 1.05x): below 1.05x at chat c=8 0.90x"
    )


def test_the_verdict_and_the_bakeoff_say_whose_requests_were_counted() -> None:
    """Per request where the responses carried it (the bench's own requests only), the counters
    where not (every request the release served in the window): each row says which."""
    from kimideploy.services.gate.bakeoff import bakeoff, table_rows

    own = [{**level(1, 70, 0.6), "metrics": "requests"}, level(8, 330, 0.6)]
    base = result([level(1, 50), level(8, 300)])
    _, _, rows = judge(result(own), base, NEEDED, 1.05)
    assert [r["counted_by"] for r in rows] == ["requests", "scraped"]
    table = bakeoff({"none": base, "good": result(own)}, NEEDED, 1.05)
    shown = {(r["candidate"], r["c"]): r["counted"] for r in table_rows(table)}
    assert shown == {("good", 1): "requests", ("good", 8): "scraped", ("none", 1): "",
                     ("none", 8): ""}  # fmt: skip


@pytest.mark.parametrize(
    ("measured", "message"),
    [
        ([level(1, 70, 0.6)], "drafter at chat c=8: the bench result has no such level"),
        (
            [level(1, 70, 0.6), level(8, 300, 0.6, failed=3)],
            "drafter at chat c=8: 3 of 10 requests failed (URLError: timed out)",
        ),
        (
            [level(1, 70, None), level(8, 300, 0.6)],
            "speculative-decoding counters are missing (metrics unavailable)",
        ),
        ([level(1, 70, 0.6), level(8, 0, 0.6)], "chat c=8: no output tokens were measured"),
    ],
)
def test_what_the_gate_cannot_measure_is_a_failure_not_a_verdict(
    measured: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(GateMeasurementError, match=message.replace("(", r"\(").replace(")", r"\)")):
        judge(result(measured), result([level(1, 50), level(8, 300)]), NEEDED, 1.05)


def test_release_record_labels_carry_the_verdict_for_kube_state_metrics() -> None:
    record = ReleaseRecord(
        "kimi-k25-serve", 2, "rolled-back", "t", "u", "rtx6000", "ns", "v3", "img", "sha", "",
        [], [],
    )  # fmt: skip
    assert "kimideploy.io/gate" not in _labels(record)
    record.details = {"gate": Verdict("rollback", "slow", 1.1, [{"speedup": 0.6667}]).details()}
    labels = _labels(record)
    assert labels["kimideploy.io/gate"] == "rollback"
    assert labels["kimideploy.io/gate-speedup"] == "0.667"
    assert labels["kimideploy.io/drafter"] == "v3"


FIXTURES = REPO / "tests" / "fixtures" / "vllm-metrics"


def exposition(drafts: float, draft_tokens: float, accepted: float) -> str:
    """The captured vLLM 0.16.0 exposition with its counters set to the given totals."""
    out = []
    for line in (FIXTURES / "0.16.0-after.txt").read_text().splitlines():
        if line.startswith("vllm:spec_decode_num_drafts_total"):
            line = line.rsplit(" ", 1)[0] + f" {drafts}"
        elif line.startswith("vllm:spec_decode_num_draft_tokens_total"):
            line = line.rsplit(" ", 1)[0] + f" {draft_tokens}"
        elif line.startswith("vllm:spec_decode_num_accepted_tokens_total"):
            line = line.rsplit(" ", 1)[0] + f" {accepted}"
        out.append(line)
    return "\n".join(out) + "\n"


def test_the_watch_acts_after_consecutive_windows_below_break_even() -> None:
    settings = WatchSettings(min_draft_tokens=300, windows_below=2, action="rollback")
    watch = AcceptanceWatch(break_even=0.1433, settings=settings)
    line, act = watch.observe({"pod-a": exposition(100, 300, 150)}, [])
    assert not act and "no window yet" in line and watch.reading["verdict"] == "no-window"
    line, act = watch.observe({"pod-a": exposition(200, 600, 180)}, [])  # 30/300 = 10%
    assert not act and "acceptance 10.0% over 300 draft tokens" in line and "(1/2 windows)" in line
    assert watch.reading == {"pods_scraped": 1, "errors": [], "break_even_rate": 0.1433,
                             "acceptance_rate": 0.1, "draft_tokens": 300,
                             "verdict": "below-break-even", "windows_below": 1,
                             "windows_to_act": 2}  # fmt: skip
    line, act = watch.observe(
        {"pod-a": exposition(210, 630, 183)}, []
    )  # too few tokens: no judgement
    assert not act and "too few to judge" in line
    assert watch.reading["verdict"] == "too-few-to-judge"
    line, act = watch.observe({"pod-a": exposition(310, 930, 200)}, ["pod-b: proxy error"])
    assert act and "(2/2 windows)" in line and "unavailable: pod-b: proxy error" in line
    assert watch.reading["errors"] == ["pod-b: proxy error"] and watch.reading["windows_below"] == 2


def test_a_paying_window_resets_the_count_and_a_restarted_pod_starts_again() -> None:
    watch = AcceptanceWatch(0.1433, WatchSettings(min_draft_tokens=100, windows_below=2))
    watch.observe({"pod-a": exposition(100, 300, 150)}, [])
    _, act = watch.observe({"pod-a": exposition(200, 600, 160)}, [])
    assert not act and watch.below == 1
    line, act = watch.observe({"pod-a": exposition(300, 900, 400)}, [])
    assert not act and watch.below == 0 and "paying" in line
    # The pod restarted: its counters are lower than before, so the window is the new totals.
    line, act = watch.observe({"pod-a": exposition(100, 300, 30)}, [])
    assert "acceptance 10.0% over 300 draft tokens" in line and watch.below == 1


def test_a_collapse_right_after_a_swap_acts_at_once_whatever_the_break_even() -> None:
    """Acceptance that falls to ~1.0 token per step after a swap (a drafter loaded wrong, no
    error) acts on its first judged window, even where break-even is lower still."""
    import time

    from kimideploy.cluster.records import ReleaseRecord
    from kimideploy.services.release.watch import swapped_at

    settings = WatchSettings(min_draft_tokens=300, windows_below=3, action="rollback")
    guarded = AcceptanceWatch(0.001, settings, guard_until=time.time() + 60)
    guarded.observe({"pod-a": exposition(100, 300, 150)}, [])
    # 100 steps, 300 draft tokens, 3 accepted: 1.03 tokens per step, 1.0% > break-even 0.1%
    line, act = guarded.observe({"pod-a": exposition(200, 600, 153)}, [])
    assert act and "mean acceptance length 1.030 < 1.05 right after a swap: COLLAPSED" in line
    assert guarded.reading["verdict"] == "collapsed-after-swap"
    assert guarded.reading["mean_acceptance_length"] == 1.03
    # The same window once the guard is over: paying by the break-even rule.
    later = AcceptanceWatch(0.001, settings, guard_until=time.time() - 1)
    later.observe({"pod-a": exposition(100, 300, 150)}, [])
    line, act = later.observe({"pod-a": exposition(200, 600, 153)}, [])
    assert not act and "paying" in line
    # Which revisions are guarded: a swap or speculation switched on, from the record.
    record = ReleaseRecord(release="r", revision=2, status="deployed", created_at="2026-12-07T20:00:00Z",
                           user="u", cluster="b300", namespace="n", drafter="v3", image="i",
                           config_sha256="0", config_text="", overrides=[], manifests=[])  # fmt: skip
    assert swapped_at(record) is None
    record.details["switch"] = {"outcome": "ready", "speculation": "off"}
    assert swapped_at(record) is None
    record.details["switch"] = {"outcome": "ready", "speculation": "on"}
    assert swapped_at(record) is not None
    record.details = {"swap": {"outcome": "ready"}}
    assert swapped_at(record) == datetime(2026, 12, 7, 20, 0, tzinfo=UTC)


def test_the_speedup_chart_is_drawn_against_the_comparable_baseline(tmp_path: Path) -> None:
    runs = [
        stored("base", levels=[level(1, 50), level(8, 300)]),
        stored("other", serve="s2", levels=[level(1, 10), level(8, 10)]),
        stored("v3", drafter="v3", hours_ago=0.5, levels=[level(1, 70, 0.6), level(8, 330, 0.6)]),
    ]
    run, series = speedup_series(runs, "v3")
    assert [(s.prompt_set, s.concurrency, s.speedup) for s in series] == [
        ("chat", [1, 8], [pytest.approx(1.4), pytest.approx(1.1)])
    ]
    chart = tmp_path / "chart.png"
    write_chart(run, series, chart, 1.05)
    assert chart.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(UsageError, match="non-speculative baseline; report a drafter's run"):
        speedup_series(runs, "base")
    with pytest.raises(UsageError, match="no stored bench run nope"):
        speedup_series(runs, "nope")
