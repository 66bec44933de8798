"""A/B on one server by interleaving: bake-off candidates that the serving pods can swap among
themselves (services/release/swap.py) are benched in several rounds, in alternating order
(A B, B A, A B, ...), each swap taking seconds instead of a model load. Every round benches each
of them over the same prompts, so drift of the machine or of the traffic around it (a neighbour's
job, thermal throttling, a cache warming up) falls on both alike, and the order alternates so
neither always goes first. A cluster that cannot hold two copies of the target compares two
drafters this way without a reload between them.

A candidate's figures are the mean over its rounds; the spread per round is reported beside them,
so a difference smaller than the spread is seen as such.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kimideploy.config.drafters import NO_DRAFTER
from kimideploy.formats.bench_result import BenchResult, LevelKey
from kimideploy.services.release.swap import decide


def swap_group(renders: dict[str, list[dict[str, Any]]]) -> tuple[list[str], dict[str, str]]:
    """The candidates (in order) that swap with the first swappable one, and why each other one
    (besides `none`) cannot be interleaved with them."""
    names = [n for n in renders if n != NO_DRAFTER]
    left_out: dict[str, str] = {}
    for first in names:
        group = [first]
        reasons: dict[str, str] = {}
        for other in names:
            if other == first:
                continue
            decision = decide(renders[first], renders[other])
            if decision.plan is not None:
                group.append(other)
            else:
                reasons[other] = decision.why_not or "its server cannot swap drafters"
        if len(group) > 1:
            return group, {n: r for n, r in reasons.items() if n not in group}
        left_out[first] = next(iter(reasons.values()), "no other candidate to swap with")
    return [], left_out


def round_orders(group: list[str], rounds: int) -> list[list[str]]:
    """Rounds 2..N after the bake-off's own first pass (which benched `group` in order): each
    round reverses the one before, so the candidates take turns going first."""
    orders, last = [], list(group)
    for _ in range(rounds - 1):
        last = list(reversed(last))
        orders.append(last)
    return orders


def run_rounds(
    orders: list[list[str]],
    serving: str | None,
    serve: Callable[[str], None],
    bench: Callable[[str], BenchResult],
) -> dict[str, list[BenchResult]]:
    """Serve and bench each candidate of each round in order, `serving` being what serves before
    the first; each one's results by round. A candidate that ends one round and starts the next
    (A B, B A) is served once for both."""
    measured: dict[str, list[BenchResult]] = {}
    for order in orders:
        for name in order:
            if name != serving:
                serve(name)
                serving = name
            measured.setdefault(name, []).append(bench(name))
    return measured


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _mean_or_first(values: list[float | None]) -> float | None:
    """The mean where every round measured the field; else the first round's value."""
    numbers = [v for v in values if v is not None]
    return _mean(numbers) if len(numbers) == len(values) else values[0]


def merge_rounds(rounds: list[BenchResult]) -> BenchResult:
    """One bench result from a candidate's rounds: each level's tokens/s, acceptance rate, mean
    acceptance length (what the bake-off judges by) and per-position acceptance are the means
    over the rounds, the rest is the first round's; `rounds` says how
    many went in."""
    if len(rounds) == 1:
        return rounds[0]
    levels = []
    for level in rounds[0].levels:
        same = [lv for result in rounds if (lv := result.level(level.key)) is not None]
        tokens = _mean([lv.output_tokens_per_s for lv in same])
        positions = [lv.per_position_acceptance for lv in same]
        first = positions[0]
        by_position = first
        if first is not None and all(p is not None and len(p) == len(first) for p in positions):
            by_position = tuple(_mean(list(at)) for at in zip(*positions, strict=True))
        levels.append(
            replace(
                level,
                output_tokens_per_s=tokens,
                acceptance_rate=_mean_or_first([lv.acceptance_rate for lv in same]),
                mean_acceptance_length=_mean_or_first([lv.mean_acceptance_length for lv in same]),
                per_position_acceptance=by_position,
            )
        )
    return rounds[0].with_levels(levels, rounds=len(rounds))


def spread_lines(measured: dict[str, list[BenchResult]], needed: list[LevelKey]) -> list[str]:
    """Per interleaved candidate and level: tokens/s and acceptance of each round."""
    lines = []
    for name, rounds in measured.items():
        for key in needed:
            levels = [result.level(key) for result in rounds]
            tokens = [lv.output_tokens_per_s if lv else None for lv in levels]
            accepted = [lv.acceptance_rate if lv else None for lv in levels]
            lines.append(
                f"{name} {key[0]} c={key[1]}: tokens/s by round "
                + ", ".join("-" if t is None else f"{t:.1f}" for t in tokens)
                + "; acceptance "
                + ", ".join("-" if a is None else f"{a:.1%}" for a in accepted)
            )
    return lines
