"""`drafter refresh`: what is learned from captured traffic (rank by rejected draft tokens,
held-out by key), and the verdict that needs a gain on the traffic and no loss elsewhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kimideploy.cli.main import main
from kimideploy.plan import refresh


def record(key: str, drafted: int | None, accepted: int = 0, day: str = "2026-12-07",
           text: str = "q") -> dict[str, Any]:  # fmt: skip
    acceptance = (
        None if drafted is None
        else {"num_draft_tokens": drafted, "num_accepted_draft_tokens": accepted}
    )  # fmt: skip
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": text},
                {"role": "assistant", "content": "served answer"}]  # fmt: skip
    return {"day": day, "key": key, "endpoint": "chat", "messages": messages,
            "max_tokens": 64, "acceptance": acceptance}  # fmt: skip


def train_keys(n: int) -> list[str]:
    """Keys on the training side of the held-out split."""
    return [k for k in (f"k{i}" for i in range(200)) if not refresh.held_out(k, 0.2)][:n]


def test_the_rank_is_rejected_draft_tokens_over_the_traffic() -> None:
    frequent, rare, good, silent = train_keys(4)
    rows = (
        [record(frequent, 10, 5) for _ in range(20)]  # half accepted, sent 20 times: 100 lost
        + [record(rare, 30, 0)]  # nothing accepted, sent once: 30 lost
        + [record(good, 10, 9) for _ in range(5)]  # 5 lost
        + [record(silent, None)]  # no acceptance reported: counted, never chosen
    )
    chosen = refresh.select(refresh.grouped(rows), max_prompts=2)
    assert [c.key for c in chosen.train] == [frequent, rare]
    assert chosen.unranked == 1 and chosen.requests == 27
    assert chosen.rejected_covered == pytest.approx(130 / 135)
    (first, _) = refresh.prompt_rows(chosen.train, chosen.requests)
    # the prompt up to the last user turn: the target answers again, the served answer is not kept
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert first["lineage"]["requests"] == 20 and first["lineage"]["acceptance_rate"] == 0.5
    assert first["lineage"]["share_of_requests"] == pytest.approx(20 / 27, abs=1e-6)


def test_held_out_conversations_are_chosen_by_key_never_by_rank() -> None:
    keys = [f"c{i}" for i in range(400)]
    rows = [record(k, 10, i % 10) for i, k in enumerate(keys)]
    chosen = refresh.select(refresh.grouped(rows), max_prompts=1000)
    held = {c.key for c in chosen.held_out}
    assert held == {k for k in keys if refresh.held_out(k, 0.2)}
    assert 40 < len(held) < 120 and not held & {c.key for c in chosen.train}


def difference(value: float, low: float, high: float) -> dict[str, Any]:
    return {"k": 3, "turns": 40, "difference": value, "ci95": [low, high]}


@pytest.mark.parametrize(
    ("captured", "general", "keep", "says"),
    [
        ((0.3, 0.1, 0.5), (-0.02, -0.08, 0.04), True, "beats the serving drafter"),
        ((0.05, -0.05, 0.15), (0.0, -0.05, 0.05), False, "no gain beyond the interval"),
        ((0.3, 0.1, 0.5), (-0.2, -0.3, -0.1), False, "loses on the general held-out set"),
        ((0.0, -0.1, 0.1), (-0.2, -0.3, -0.1), False, "and a loss elsewhere"),
    ],
)
def test_the_verdict_needs_both_sets_and_names_both(
    captured: tuple[float, float, float], general: tuple[float, float, float], keep: bool,
    says: str,
) -> None:  # fmt: skip
    found = refresh.verdict(difference(*captured), difference(*general))
    assert found.keep is keep and says in found.reason
    assert "captured traffic" in found.reason and "general held-out" in found.reason


def test_the_command_writes_the_prompts_and_never_overwrites(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capture = tmp_path / "capture"
    capture.mkdir()
    rows = [record(k, 10, i % 7, text=k) for i, k in enumerate(f"p{i}" for i in range(60))]
    (capture / "2026-12-07.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (capture / "2026-12-08.jsonl").write_text("not json\n")
    out = tmp_path / "refresh"
    args = ["drafter", "refresh", "v3", "--capture", str(capture), "--out", str(out),
            "--max-prompts", "5", "-o", "json"]  # fmt: skip
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["chosen"] == 5 and summary["unreadable_lines"] == 1
    prompts = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    held = [json.loads(line) for line in (out / "held-out.jsonl").read_text().splitlines()]
    assert len(prompts) == 5 and len(held) == summary["held_out"] > 0
    assert all(p["lineage"]["source"] == "capture" for p in prompts + held)
    assert not {p["id"] for p in prompts} & {h["id"] for h in held}
    assert main(args) == 2 and "holds a refresh already" in capsys.readouterr().err
    assert main([*args[:2], "nope", *args[3:]]) == 2
    assert "not an EAGLE-3 drafter" in capsys.readouterr().err
    missing = ["drafter", "refresh", "v3", "--capture", str(tmp_path / "x"), "--out",
               str(tmp_path / "o")]  # fmt: skip
    assert main(missing) == 2 and "no capture folder" in capsys.readouterr().err


def test_an_anchor_without_a_base_drafter_is_refused() -> None:
    from pydantic import ValidationError

    from kimideploy.config.workloads import TrainSettings

    with pytest.raises(ValidationError, match="set base_drafter"):
        TrainSettings(drafter="v4", anchor_weight=1.0, resources={"cpu": "1", "memory": "1Gi"})
    kept = TrainSettings(drafter="v4", base_drafter="v3", anchor_weight=1.0,
                         resources={"cpu": "1", "memory": "1Gi"})  # fmt: skip
    assert kept.anchor_weight == 1.0


def test_the_paired_figure_is_vllms_mean_acceptance_length_difference() -> None:
    def counts(accepted: int, steps: int) -> dict[str, int]:
        return {"num_accepted_draft_tokens": accepted, "num_spec_steps": steps}

    serving = [counts(10, 10), counts(5, 10), counts(0, 10)] * 10  # 1 + 15/30 = 1.5
    refreshed = [counts(20, 10), counts(10, 10), counts(0, 10)] * 10  # 1 + 30/30 = 2.0
    found = refresh.paired_requests(serving, refreshed, 3)
    assert found["difference"] == 0.5 and found["turns"] == 30
    assert (found["serving"], found["candidate"]) == (1.5, 2.0)
    assert found["serving_ci95"][0] < 1.5 < found["serving_ci95"][1]
    assert 0 < found["ci95"][0] <= 0.5 <= found["ci95"][1]
    assert refresh.paired_requests(serving, serving, 3)["ci95"] == [0.0, 0.0]
    # a small loss on the general set: below zero paired, within the serving drafter's interval
    slightly = [counts(10, 10), counts(4, 10), counts(0, 10)] * 10
    general = refresh.paired_requests(serving, slightly, 3)
    assert general["ci95"][1] < 0 <= general["candidate"] - general["serving_ci95"][0]
    assert refresh.verdict(found, general).keep
    lost = refresh.paired_requests(serving, [counts(1, 10)] * 30, 3)
    assert not refresh.verdict(found, lost).keep
    with pytest.raises(ValueError, match="paired judgements"):
        refresh.paired_requests(serving, refreshed[:-1], 3)
