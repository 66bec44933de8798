"""One `run bench` result as a typed value: what the bench pod writes (result.json and its
`result` event), what the cluster keeps (the bench ConfigMap) and what the gate, the bake-off, the
calibration sweep, the doctor and `bench list` read. Parsed once, where it enters (a pod's log or a
stored ConfigMap), and checked there; every reader after that takes fields, not dictionary keys.

The JSON shape is the one the bench pod has always written, so results stored by earlier versions
read back, and `as_dict()` writes what they would have: keys a level carries only in some runs
(`speedup` with a baseline, `synthetic_*` in a calibration sweep) are left out when they are None.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from kimideploy.formats.output_diversity import is_degenerate

SOMETIMES = (
    "speedup",
    "baseline_tokens_per_s",
    "synthetic_acceptance_length",
    "synthetic_rates",
    "rounds",
    "kernels",
    "distinct_bigrams",
    "judged_outputs",
    "degenerate_outputs",
)
"""Fields written only when a run has them."""

LevelKey = tuple[str, int]
"""(prompt set, concurrency): what identifies a level across runs."""


class BenchResultError(ValueError):
    """A bench result that is not the shape the bench pod writes; the message says which field."""


@dataclass(frozen=True, kw_only=True)
class BenchLevel:
    """One prompt set at one concurrency: throughput, latency and what vLLM counted."""

    prompt_set: str
    concurrency: int
    output_tokens_per_s: float
    requests: int = 0
    failed: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p99_s: float | None = None
    metrics: str = "unavailable"
    """Where acceptance came from: `requests` (each response's own figures), `scraped` (the
    /metrics counters over the level's window) or `unavailable`."""
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    per_position_acceptance: tuple[float, ...] | None = None
    per_position_basis: str | None = None
    scraped_acceptance_rate: float | None = None
    errors: tuple[str, ...] = ()
    speedup: float | None = None
    """Over the baseline result the pod was given (bench.baseline_run), where it had the level."""
    baseline_tokens_per_s: float | None = None
    synthetic_acceptance_length: float | None = None
    synthetic_rates: tuple[float, ...] | None = None
    distinct_bigrams: float | None = None
    """The mean share of distinct word bigrams of the outputs long enough to judge
    (formats/output_diversity.py); None in results written before it was measured."""
    judged_outputs: int | None = None
    degenerate_outputs: int | None = None
    """Outputs that repeat themselves (a distinct-bigram share below 0.5)."""

    @property
    def key(self) -> LevelKey:
        return (self.prompt_set, self.concurrency)

    @property
    def degenerate(self) -> bool:
        """Most of what the level measured is a loop: its acceptance is the loop's."""
        return is_degenerate(self.judged_outputs or 0, self.degenerate_outputs or 0)

    @property
    def counted_by(self) -> str | None:
        """Where the level's acceptance comes from: `requests` (each response's own figures, vLLM
        >= 0.32 with --per-request-spec-decode-metrics: the bench's requests only), `scraped` (the
        /metrics counters over the level's window: every request the release served meanwhile),
        or None where nothing was counted (no drafter)."""
        return self.metrics if self.metrics in ("requests", "scraped") else None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if value is None and field.name in SOMETIMES:
                continue
            out[field.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "a level") -> BenchLevel:
        if not isinstance(data, Mapping):
            raise BenchResultError(f"{where} is {type(data).__name__}, not an object")
        prompt_set = data.get("prompt_set")
        if not isinstance(prompt_set, str):
            raise BenchResultError(f"{where}: prompt_set is {prompt_set!r}")
        where = f"{where} ({prompt_set} c={data.get('concurrency')})"
        speed = _number(data, "output_tokens_per_s", where)
        if speed is None or speed < 0:
            raise BenchResultError(f"{where}: output_tokens_per_s is {speed!r}")
        return cls(
            prompt_set=prompt_set,
            concurrency=_required_integer(data, "concurrency", where),
            output_tokens_per_s=speed,
            requests=_count(data, "requests", where),
            failed=_count(data, "failed", where),
            output_tokens=_count(data, "output_tokens", where),
            seconds=_number(data, "seconds", where) or 0.0,
            ttft_p50_s=_number(data, "ttft_p50_s", where),
            ttft_p99_s=_number(data, "ttft_p99_s", where),
            tpot_p50_s=_number(data, "tpot_p50_s", where),
            tpot_p99_s=_number(data, "tpot_p99_s", where),
            metrics=str(data.get("metrics") or "unavailable"),
            acceptance_rate=_number(data, "acceptance_rate", where),
            mean_acceptance_length=_number(data, "mean_acceptance_length", where),
            per_position_acceptance=_numbers(data, "per_position_acceptance", where),
            per_position_basis=_text(data, "per_position_basis", where),
            scraped_acceptance_rate=_number(data, "scraped_acceptance_rate", where),
            errors=tuple(str(e) for e in data.get("errors") or ()),
            speedup=_number(data, "speedup", where),
            baseline_tokens_per_s=_number(data, "baseline_tokens_per_s", where),
            synthetic_acceptance_length=_number(data, "synthetic_acceptance_length", where),
            synthetic_rates=_numbers(data, "synthetic_rates", where),
            distinct_bigrams=_number(data, "distinct_bigrams", where),
            judged_outputs=_optional_integer(data, "judged_outputs", where),
            degenerate_outputs=_optional_integer(data, "degenerate_outputs", where),
        )


@dataclass(frozen=True, kw_only=True)
class BenchResult:
    """A whole bench run: its levels in the order measured, and what it was run with."""

    levels: tuple[BenchLevel, ...]
    run_id: str | None = None
    drafter: str | None = None
    endpoint: str | None = None
    model: str | None = None
    max_tokens: int | None = None
    baseline: str | None = None
    """The path of the baseline result.json the pod compared with, if any."""
    num_speculative_tokens: int | None = None
    rounds: int | None = None
    """How many interleaved rounds were averaged into it (a bake-off's A/B rounds)."""
    kernels: str | None = None
    """The kernels the figures were measured on, as the plan named them (BenchSpec.kernels)."""

    def by_key(self) -> dict[LevelKey, BenchLevel]:
        return {level.key: level for level in self.levels}

    def level(self, key: LevelKey) -> BenchLevel | None:
        return self.by_key().get(key)

    def covers(self, needed: Iterable[LevelKey]) -> bool:
        return set(needed) <= set(self.by_key())

    def with_levels(self, levels: Iterable[BenchLevel], **changes: Any) -> BenchResult:
        return replace(self, levels=tuple(levels), **changes)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name == "levels":
                out["levels"] = [level.as_dict() for level in self.levels]
            elif not (value is None and field.name in SOMETIMES):
                out[field.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Any) -> BenchResult:
        """Raises BenchResultError naming the field that is not what the bench pod writes."""
        if not isinstance(data, Mapping):
            raise BenchResultError(f"the result is {type(data).__name__}, not an object")
        levels = data.get("levels")
        if not isinstance(levels, list):
            raise BenchResultError("result.levels is not a list of levels")
        return cls(
            levels=tuple(
                BenchLevel.from_dict(level, f"result.levels[{i}]") for i, level in enumerate(levels)
            ),
            run_id=_text(data, "run_id", "result"),
            drafter=_text(data, "drafter", "result"),
            endpoint=_text(data, "endpoint", "result"),
            model=_text(data, "model", "result"),
            max_tokens=_optional_integer(data, "max_tokens", "result"),
            baseline=_text(data, "baseline", "result"),
            num_speculative_tokens=_optional_integer(data, "num_speculative_tokens", "result"),
            rounds=_optional_integer(data, "rounds", "result"),
            kernels=_text(data, "kernels", "result"),
        )


def _number(data: Mapping[str, Any], name: str, where: str) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BenchResultError(f"{where}: {name} is {value!r}, not a number")
    return float(value)


def _optional_integer(data: Mapping[str, Any], name: str, where: str) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BenchResultError(f"{where}: {name} is {value!r}, not a whole number")
    return value


def _required_integer(data: Mapping[str, Any], name: str, where: str) -> int:
    value = _optional_integer(data, name, where)
    if value is None:
        raise BenchResultError(f"{where}: {name} is missing")
    return value


def _count(data: Mapping[str, Any], name: str, where: str) -> int:
    return _optional_integer(data, name, where) or 0


def _numbers(data: Mapping[str, Any], name: str, where: str) -> tuple[float, ...] | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, list | tuple) or any(
        isinstance(v, bool) or not isinstance(v, int | float) for v in value
    ):
        raise BenchResultError(f"{where}: {name} is {value!r}, not a list of numbers")
    return tuple(float(v) for v in value)


def _text(data: Mapping[str, Any], name: str, where: str) -> str | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BenchResultError(f"{where}: {name} is {value!r}, not text")
    return value
