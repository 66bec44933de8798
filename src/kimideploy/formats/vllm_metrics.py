"""vLLM's speculative-decoding counters from two /metrics scrapes (Prometheus text format).

Acceptance rate = accepted / draft tokens; mean acceptance length = 1 + accepted / drafts;
per-position acceptance = accepted at position i / the drafts that reached position i, all over
the difference of the two scrapes and summed over engines (data-parallel replicas). Where the
server reports each request's own acceptance (vLLM >= 0.32), `from_requests` sums those instead:
the same figures, without other traffic in the window.

Which drafts reached position i is known exactly when every draft had the full length k (draft
tokens = drafts x k: a fixed k, the usual EAGLE-3 case) or when the engine counts drafts by their
scheduled length (`vllm:spec_decode_num_drafts_by_draft_length`, newer vLLM than the pinned 0.16
and 0.32). Otherwise (suffix decoding, n-gram with no match, a k schedule that shortens drafts at
high batch sizes, on an engine without that counter) the per-position figure divides by all
drafts, which understates the later positions; `per_position_basis` says which it is.
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
DRAFTS_BY_LENGTH = "vllm:spec_decode_num_drafts_by_draft_length_total"

BASIS_BY_LENGTH = "exact: drafts counted by length"
BASIS_FULL_LENGTH = "exact: every draft had the full length"
BASIS_APPROXIMATE = (
    "approximate: drafts of varying length and no per-length counter, so later positions are "
    "divided by every draft (understated)"
)

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
    drafts_by_length: tuple[float, ...] | None = None
    """Drafts by scheduled draft length 0..k, where the engine counts them."""

    @property
    def rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1 + self.accepted / self.drafts if self.drafts else None

    @property
    def per_position_basis(self) -> str:
        counted: float = sum(self.drafts_by_length or ())
        if counted > 0:
            return BASIS_BY_LENGTH
        if self.draft_tokens == self.drafts * len(self.per_position):
            return BASIS_FULL_LENGTH
        return BASIS_APPROXIMATE

    @property
    def per_position_rate(self) -> tuple[float, ...]:
        """Position i accepted given a draft reached it (see the module docstring)."""
        if not self.drafts:
            return ()
        if self.per_position_basis != BASIS_BY_LENGTH:
            return tuple(p / self.drafts for p in self.per_position)
        lengths = self.drafts_by_length or ()
        reached = [sum(lengths[i + 1 :]) for i in range(len(self.per_position))]
        return tuple(p / n if n else 0.0 for p, n in zip(self.per_position, reached, strict=True))


def conditional_rates(unconditional: list[float]) -> list[float]:
    """P(accept i | accepted 1..i-1) = u_i / u_(i-1): vLLM's per-position rate at a fixed k
    (accepted at i over drafts) as the conditional rates a sampler draws against and the speedup
    model multiplies."""
    out, previous = [], 1.0
    for rate in unconditional:
        out.append(rate / previous if previous > 0 else 0.0)
        previous = rate
    return out


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


def _by_index(metrics: Samples, name: str, label: str) -> dict[int, float]:
    """`name` summed over engines, by the integer in `label` (position, draft_length)."""
    out: dict[int, float] = {}
    for labels, value in metrics.get(name, {}).items():
        index = int(dict(labels)[label])
        out[index] = out.get(index, 0.0) + value
    return out


def _difference(first: Samples, second: Samples, name: str, label: str) -> tuple[float, ...]:
    before, after = _by_index(first, name, label), _by_index(second, name, label)
    return tuple(after[i] - before.get(i, 0.0) for i in sorted(after))


def acceptance(
    before: str, after: str, reader: Callable[[str], Samples] = parse
) -> Acceptance | None:
    """None when the server exposes no speculative-decoding counters (no drafter)."""
    first, second = reader(before), reader(after)
    if DRAFTS not in second:
        return None
    return Acceptance(
        drafts=_total(second, DRAFTS) - _total(first, DRAFTS),
        draft_tokens=_total(second, DRAFT_TOKENS) - _total(first, DRAFT_TOKENS),
        accepted=_total(second, ACCEPTED) - _total(first, ACCEPTED),
        per_position=_difference(first, second, PER_POSITION, "position"),
        drafts_by_length=(
            _difference(first, second, DRAFTS_BY_LENGTH, "draft_length")
            if DRAFTS_BY_LENGTH in second
            else None
        ),
    )


def summed(parts: list[Acceptance]) -> Acceptance | None:
    """Several servers' acceptance as one (a per-length count only where every part has one)."""
    if not parts:
        return None

    def columns(rows: list[tuple[float, ...]]) -> tuple[float, ...]:
        width = max((len(r) for r in rows), default=0)
        return tuple(sum(r[i] for r in rows if i < len(r)) for i in range(width))

    lengths = [p.drafts_by_length for p in parts]
    return Acceptance(
        drafts=sum(p.drafts for p in parts),
        draft_tokens=sum(p.draft_tokens for p in parts),
        accepted=sum(p.accepted for p in parts),
        per_position=columns([p.per_position for p in parts]),
        drafts_by_length=(
            None if any(n is None for n in lengths) else columns([n for n in lengths if n])
        ),
    )
