"""How repetitive a bench's outputs are: the share of distinct word bigrams in each output.

A drafter's acceptance on degenerate output (a model looping on one phrase, a raw completion that
repeats its prompt) is far above what it earns on real traffic: the next token of a loop is easy
to guess (tokenspeed#1305 measured 74.6% acceptance on a degenerate raw completion against 48.5%
on chat). A bench whose outputs loop measures the loop, so the gate does not use it.

Word bigrams, not tokens: the bench sees text, and a loop of any length repeats its words. An
ordinary answer keeps nearly all its bigrams distinct (0.75-1.0 on the pipeline tier's target,
whose answers are short and formulaic); a loop of an n-word phrase keeps about n of its bigrams.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

MIN_WORDS = 8
"""Shorter outputs are not judged: a few words say nothing about repetition."""
DEGENERATE_BELOW = 0.5
"""An output whose distinct-bigram share is below this repeats itself for at least half of it."""
DEGENERATE_SHARE = 0.25
"""A level is degenerate when more than this share of its judged outputs are."""


def distinct_bigrams(text: str) -> float | None:
    """Distinct word bigrams over all of them; None for an output too short to judge."""
    words = text.split()
    if len(words) < MIN_WORDS:
        return None
    pairs = list(itertools.pairwise(words))
    return len(set(pairs)) / len(pairs)


@dataclass(frozen=True)
class Diversity:
    """A level's outputs: how many were judged, how many loop, and their mean share."""

    judged: int
    degenerate: int
    mean_distinct_bigrams: float | None

    @classmethod
    def of(cls, shares: Iterable[float | None]) -> Diversity:
        judged = [share for share in shares if share is not None]
        return cls(
            judged=len(judged),
            degenerate=sum(1 for share in judged if share < DEGENERATE_BELOW),
            mean_distinct_bigrams=round(sum(judged) / len(judged), 4) if judged else None,
        )


def is_degenerate(judged: int, degenerate: int) -> bool:
    return judged > 0 and degenerate > DEGENERATE_SHARE * judged
