"""vLLM's speculative-decoding counters from two /metrics scrapes (Prometheus text format).

Acceptance rate = accepted / draft tokens; mean acceptance length = 1 + accepted / drafts;
per-position acceptance = accepted at position i / drafts, all over the difference of the two
scrapes and summed over engines (data-parallel replicas). Where the server reports each
request's own acceptance (vLLM >= 0.32), `from_requests` sums those instead: the same figures,
without other traffic in the window.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*\"")
ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SPEC_DECODE_METRICS = (DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POSITION)

Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]
"""metric name -> {sorted (label, unescaped value) pairs: value}."""


def parse(text: str) -> Samples:
    """The text exposition format, read without a dependency (the CLI's path: `watch` and the
    gate's scrapes). Label values are unescaped (\\\\, \\", \\n) and may hold braces, commas and
    quotes: a served model name is the user's. A line that is not a sample is skipped."""
    found: Samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            sample = _sample(line)
            if sample is not None:
                name, labels, value = sample
                found.setdefault(name, {})[labels] = value
    return found


def parse_with_client(text: str) -> Samples:
    """The same, read by prometheus_client's own parser (the bench pod's path: the vLLM image
    ships prometheus_client, the library that wrote the exposition)."""
    from prometheus_client.parser import text_string_to_metric_families

    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            found.setdefault(sample.name, {})[labels] = float(sample.value)
    return found


def _sample(line: str) -> tuple[str, tuple[tuple[str, str], ...], float] | None:
    named = NAME.match(line)
    if named is None:
        return None
    name, at, labels = named.group(), named.end(), []
    if line.startswith("{", at):
        at = _skip_spaces(line, at + 1)
        while not line.startswith("}", at):
            label = LABEL_NAME.match(line, at)
            value, at = _quoted(line, label.end()) if label else (None, at)
            if label is None or value is None:
                return None
            labels.append((label.group(1), value))
            at = _skip_spaces(line, at)
            if line.startswith(",", at):
                at = _skip_spaces(line, at + 1)
            elif not line.startswith("}", at):
                return None
        at += 1
    fields = line[at:].split()
    if not fields or not line[at].isspace():
        return None
    try:
        return name, tuple(sorted(labels)), float(fields[0])
    except ValueError:
        return None


def _skip_spaces(line: str, at: int) -> int:
    while at < len(line) and line[at] in " \t":
        at += 1
    return at


def _quoted(line: str, at: int) -> tuple[str | None, int]:
    """The label value that starts at `at` (after its opening quote), unescaped; and where the
    text after its closing quote starts."""
    out: list[str] = []
    while at < len(line):
        char = line[at]
        if char == "\\" and at + 1 < len(line):
            out.append(ESCAPES.get(line[at + 1], "\\" + line[at + 1]))
            at += 2
        elif char == '"':
            return "".join(out), at + 1
        else:
            out.append(char)
            at += 1
    return None, at


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


def from_requests(reports: list[dict[str, Any]]) -> Acceptance | None:
    """Acceptance over requests' own `metrics.speculative_decoding` (vLLM >= 0.32 with
    --per-request-spec-decode-metrics): each report's histogram counts verify steps by the number
    j of draft tokens accepted, so position p (from 0) was accepted in the steps with j > p."""
    if not reports:
        return None
    width = max(r["num_spec_tokens"] for r in reports)
    per_position = [0.0] * width
    for report in reports:
        for j, steps in enumerate(report["acceptance_histogram"]):
            for position in range(min(j, width)):
                per_position[position] += steps
    return Acceptance(
        drafts=float(sum(r["num_spec_steps"] for r in reports)),
        draft_tokens=float(sum(r["num_draft_tokens"] for r in reports)),
        accepted=float(sum(r["num_accepted_draft_tokens"] for r in reports)),
        per_position=tuple(per_position),
    )


def _total(metrics: Samples, name: str) -> float:
    return sum(metrics.get(name, {}).values())


def _per_position(metrics: Samples) -> dict[int, float]:
    out: dict[int, float] = {}
    for labels, value in metrics.get(PER_POSITION, {}).items():
        position = int(dict(labels)["position"])
        out[position] = out.get(position, 0.0) + value
    return out


def acceptance(
    before: str, after: str, reader: Callable[[str], Samples] = parse
) -> Acceptance | None:
    """None when the server exposes no speculative-decoding counters (no drafter)."""
    first, second = reader(before), reader(after)
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
