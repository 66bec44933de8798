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
from typing import Any

from kimideploy.config.drafters import NO_DRAFTER
from kimideploy.services.release.swap import decide

AVERAGED = ("output_tokens_per_s", "acceptance_rate", "mean_acceptance_length")
"""Level fields a candidate's rounds are averaged over (the ones the bake-off judges by)."""


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
    bench: Callable[[str], dict[str, Any]],
) -> dict[str, list[dict[str, Any]]]:
    """Serve and bench each candidate of each round in order, `serving` being what serves before
    the first; each one's results by round. A candidate that ends one round and starts the next
    (A B, B A) is served once for both."""
    measured: dict[str, list[dict[str, Any]]] = {}
    for order in orders:
        for name in order:
            if name != serving:
                serve(name)
                serving = name
            measured.setdefault(name, []).append(bench(name))
    return measured


def _mean(values: list[Any]) -> Any:
    numbers = [float(v) for v in values if isinstance(v, int | float)]
    if len(numbers) != len(values):
        return values[0]
    return sum(numbers) / len(numbers)


def merge_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One bench result from a candidate's rounds: each level's AVERAGED fields and per-position
    acceptance are the means over the rounds, the rest is the first round's; `rounds` says how
    many went in."""
    if len(rounds) == 1:
        return rounds[0]
    merged = {**rounds[0], "rounds": len(rounds)}
    levels = []
    for level in rounds[0].get("levels", []):
        key = (level.get("prompt_set"), level.get("concurrency"))
        same = [
            lv
            for result in rounds
            for lv in result.get("levels", [])
            if (lv.get("prompt_set"), lv.get("concurrency")) == key
        ]
        combined = dict(level)
        for field in AVERAGED:
            combined[field] = _mean([lv.get(field) for lv in same])
        positions = [lv.get("per_position_acceptance") for lv in same]
        if all(isinstance(p, list) and len(p) == len(positions[0]) for p in positions):
            by_position = zip(*positions, strict=True)
            combined["per_position_acceptance"] = [_mean(list(at)) for at in by_position]
        levels.append(combined)
    merged["levels"] = levels
    return merged


def spread_lines(
    measured: dict[str, list[dict[str, Any]]], needed: list[tuple[str, int]]
) -> list[str]:
    """Per interleaved candidate and level: tokens/s and acceptance of each round."""
    lines = []
    for name, rounds in measured.items():
        for prompt_set, concurrency in needed:
            tokens, accepted = [], []
            for result in rounds:
                level: dict[str, Any] = next((lv for lv in result.get("levels", [])
                                              if (lv.get("prompt_set"), lv.get("concurrency"))
                                              == (prompt_set, concurrency)), {})  # fmt: skip
                tokens.append(level.get("output_tokens_per_s"))
                accepted.append(level.get("acceptance_rate"))
            lines.append(
                f"{name} {prompt_set} c={concurrency}: tokens/s by round "
                + ", ".join("-" if t is None else f"{t:.1f}" for t in tokens)
                + "; acceptance "
                + ", ".join("-" if a is None else f"{a:.1%}" for a in accepted)
            )
    return lines
