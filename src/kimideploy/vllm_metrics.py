"""vLLM's speculative-decoding counters from two /metrics scrapes (Prometheus text format).

Acceptance rate = accepted / draft tokens; mean acceptance length = 1 + accepted / drafts;
per-position acceptance = accepted at position i / drafts, all over the difference of the two
scrapes and summed over engines (data-parallel replicas).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)"
)
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SPEC_DECODE_METRICS = (DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POSITION)


def parse(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """metric name -> {sorted label pairs: value}."""
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line) if line and not line.startswith("#") else None
        if match:
            labels = tuple(sorted(LABEL.findall(match.group("labels") or "")))
            found.setdefault(match.group("name"), {})[labels] = float(match.group("value"))
    return found


@dataclass(frozen=True)
class Acceptance:
    drafts: float
    draft_tokens: float
    accepted: float
    per_position: tuple[float, ...]

    @property
    def rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1 + self.accepted / self.drafts if self.drafts else None

    @property
    def per_position_rate(self) -> tuple[float, ...]:
        return tuple(p / self.drafts for p in self.per_position) if self.drafts else ()


def _total(metrics: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str) -> float:
    return sum(metrics.get(name, {}).values())


def _per_position(metrics: dict[str, dict[tuple[tuple[str, str], ...], float]]) -> dict[int, float]:
    out: dict[int, float] = {}
    for labels, value in metrics.get(PER_POSITION, {}).items():
        position = int(dict(labels)["position"])
        out[position] = out.get(position, 0.0) + value
    return out


def acceptance(before: str, after: str) -> Acceptance | None:
    """None when the server exposes no speculative-decoding counters (no drafter)."""
    first, second = parse(before), parse(after)
    if DRAFTS not in second:
        return None
    positions_before, positions_after = _per_position(first), _per_position(second)
    return Acceptance(
        drafts=_total(second, DRAFTS) - _total(first, DRAFTS),
        draft_tokens=_total(second, DRAFT_TOKENS) - _total(first, DRAFT_TOKENS),
        accepted=_total(second, ACCEPTED) - _total(first, ACCEPTED),
        per_position=tuple(
            positions_after[p] - positions_before.get(p, 0.0) for p in sorted(positions_after)
        ),
    )
