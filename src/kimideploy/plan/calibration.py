"""Measured step cost C(k, c) per cluster (`run calibrate`), and the cost model predictions use.

With mean acceptance length L (tokens per verify step) and step cost C (a speculative step's time
over a plain decode step's, at the same concurrency), speedup = L / C, so C is also the
break-even acceptance length. `run calibrate` measures output tokens/s at synthetic acceptance
lengths L_j with k draft tokens at concurrency c, and plain tokens/s at c; each level gives
C = L_measured / speedup. C does not depend on L (the draft and verify passes are the same work
whatever is accepted), so per (k, c) the fit is the least-squares C of speedup = L / C over the
lengths, and the spread of the levels around it is reported as the fit's residual.

For a k that was not measured, C(k, c) = 1 + a_c * k with a_c fitted through the measured k at c
(a_c is the measured counterpart of clusters.X.step_cost_per_token); between measured
concurrencies C is interpolated in log2(c), beyond them the nearest measured one is used.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from kimideploy.plan import speedup as model

CALIBRATION_SCHEMA = "kimideploy.calibration.v1"
DEFAULT_KS = (1, 2, 3, 4)
DEFAULT_LENGTHS = (1.5, 2.0, 2.5, 3.0)


def lengths_for(k: int, lengths: tuple[float, ...]) -> tuple[float, ...]:
    """The requested lengths vLLM accepts for k ([1, k+1]); k+1 itself when none fits."""
    fitting = tuple(sorted({length for length in lengths if 1 <= length <= k + 1}))
    return fitting or (float(k + 1),)


@dataclass(frozen=True)
class Point:
    """One measured level of a calibration run."""

    k: int
    concurrency: int
    prompt_set: str
    requested_length: float
    measured_length: float | None
    tokens_per_s: float
    baseline_tokens_per_s: float

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.baseline_tokens_per_s

    @property
    def length(self) -> float:
        """vLLM's counters when they were scraped, else what was asked for."""
        return self.measured_length if self.measured_length is not None else self.requested_length


@dataclass(frozen=True)
class StepCost:
    k: int
    concurrency: int
    cost: float
    residual: float
    """Root-mean-square relative error of speedup = L / cost over the levels."""
    levels: int


def fit_step_cost(points: list[Point]) -> StepCost:
    """Least squares of speedup = L * x over the points of one (k, c); cost = 1 / x."""
    if not points:
        raise ValueError("no points to fit")
    ks, cs = {p.k for p in points}, {p.concurrency for p in points}
    if len(ks) != 1 or len(cs) != 1:
        raise ValueError(f"points of one (k, c) only, got k={sorted(ks)} c={sorted(cs)}")
    inverse = sum(p.length * p.speedup for p in points) / sum(p.length**2 for p in points)
    cost = 1 / inverse
    errors = [(p.length / cost - p.speedup) / p.speedup for p in points]
    residual = math.sqrt(sum(e * e for e in errors) / len(errors))
    return StepCost(
        points[0].k, points[0].concurrency, round(cost, 4), round(residual, 4), len(points)
    )


def fit(points: list[Point]) -> list[StepCost]:
    groups: dict[tuple[int, int], list[Point]] = {}
    for point in points:
        groups.setdefault((point.k, point.concurrency), []).append(point)
    return [fit_step_cost(groups[key]) for key in sorted(groups)]


@dataclass(frozen=True)
class Calibration:
    """What `run calibrate` stores: the grid, where it was measured, the points and the fit."""

    cluster: str
    image: str
    serve_fingerprint: str
    bench_fingerprint: str
    gpus: str
    drafter: str
    measured_at: str
    ks: list[int]
    lengths: list[float]
    concurrency: list[int]
    baseline_run: str
    points: list[Point]
    runs: dict[str, str] = field(default_factory=dict)
    """k -> the bench run id that measured it (a k present here is done: resume skips it)."""
    complete: bool = False
    bench_settings: dict[str, Any] = field(default_factory=dict)
    """The bench settings the levels were measured with (bench_fingerprint is their hash)."""

    @property
    def costs(self) -> list[StepCost]:
        return fit(self.points)

    @property
    def date(self) -> str:
        return self.measured_at[:10]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": CALIBRATION_SCHEMA, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Calibration:
        if data.get("schema") != CALIBRATION_SCHEMA:
            raise ValueError(f"unknown calibration schema {data.get('schema')!r}")
        fields = {k: v for k, v in data.items() if k != "schema"}
        fields["points"] = [_checked_point(p) for p in fields["points"]]
        if not isinstance(fields.get("measured_at"), str):
            raise ValueError("measured_at is not a timestamp")
        return cls(**fields)


def _checked_point(raw: Any) -> Point:
    """A stored point a prediction can use: a zero or negative throughput (a failed level, or
    a planted record) would divide by zero in every prediction that reads it."""
    point = Point(**raw)
    numbers = (point.requested_length, point.tokens_per_s, point.baseline_tokens_per_s)
    if not all(isinstance(n, int | float) and math.isfinite(n) for n in numbers):
        raise ValueError(f"a point of k={point.k} has a non-number")
    if point.k < 1 or point.concurrency < 1 or point.requested_length < 1:
        raise ValueError(f"a point has k={point.k}, c={point.concurrency}")
    if point.tokens_per_s <= 0 or point.baseline_tokens_per_s <= 0:
        raise ValueError(
            f"a point of k={point.k}, c={point.concurrency} has {point.tokens_per_s} tokens/s "
            f"over a baseline of {point.baseline_tokens_per_s}"
        )
    return point


class CostModel(Protocol):
    @property
    def source(self) -> str: ...

    def cost(self, k: int, concurrency: int) -> float: ...


@dataclass(frozen=True)
class DefaultCost:
    """Today's model: one constant per cluster, the same at every concurrency."""

    per_token: float
    cluster: str

    @property
    def source(self) -> str:
        return (
            f"default constant step_cost_per_token {self.per_token} "
            f"(clusters.{self.cluster}; `kimideploy run calibrate` measures it)"
        )

    def cost(self, k: int, concurrency: int) -> float:
        return model.step_cost(k, self.per_token)


@dataclass(frozen=True)
class MeasuredCost:
    calibration: Calibration

    @property
    def source(self) -> str:
        return f"measured on {self.calibration.date} (`kimideploy calibrate show`)"

    def per_token(self, concurrency: int) -> float:
        """a_c of C = 1 + a_c k, least squares through the measured k at this concurrency."""
        return self._along_concurrency(concurrency, self._per_token_at)

    def cost(self, k: int, concurrency: int) -> float:
        return self._along_concurrency(concurrency, lambda c: self._cost_at(k, c))

    def _table(self) -> dict[tuple[int, int], float]:
        return {(s.k, s.concurrency): s.cost for s in self.calibration.costs}

    def measured_concurrency(self) -> list[int]:
        return sorted({c for _, c in self._table()})

    def _per_token_at(self, concurrency: int) -> float:
        rows = [(k, cost) for (k, c), cost in self._table().items() if c == concurrency]
        return sum(k * (cost - 1) for k, cost in rows) / sum(k * k for k, _ in rows)

    def _cost_at(self, k: int, concurrency: int) -> float:
        measured = self._table().get((k, concurrency))
        if measured is not None:
            return measured
        return 1 + k * self._per_token_at(concurrency)

    def _along_concurrency(self, concurrency: int, at: Any) -> float:
        levels = self.measured_concurrency()
        if not levels:
            raise ValueError("the calibration has no measured levels")
        if concurrency <= levels[0]:
            return float(at(levels[0]))
        if concurrency >= levels[-1]:
            return float(at(levels[-1]))
        upper = next(c for c in levels if c >= concurrency)
        lower = max(c for c in levels if c <= concurrency)
        if upper == lower:
            return float(at(lower))
        t = (math.log2(concurrency) - math.log2(lower)) / (math.log2(upper) - math.log2(lower))
        return float(at(lower) * (1 - t) + at(upper) * t)


def speedup(costs: CostModel, k: int, length: float, concurrency: int) -> float:
    return length / costs.cost(k, concurrency)


def drafter_speedup(costs: CostModel, per_position: list[float], k: int, concurrency: int) -> float:
    """From a drafter's measured conditional acceptance per position (the last one repeats)."""
    return model.tokens_per_step(model.rates_at_k(per_position, k)) / costs.cost(k, concurrency)


def break_even_length(costs: CostModel, k: int, concurrency: int) -> float:
    """The acceptance length at which speculation with k drafts ties plain decoding."""
    return costs.cost(k, concurrency)


def break_even_rate(costs: CostModel, k: int, concurrency: int) -> float:
    """vLLM's acceptance rate (accepted / drafted) at break-even: L = 1 + k r."""
    return (costs.cost(k, concurrency) - 1) / k


def required_length(costs: CostModel, k: int, concurrency: int, min_speedup: float) -> float:
    """The acceptance length a drafter must reach for `min_speedup` (may exceed k + 1)."""
    return min_speedup * costs.cost(k, concurrency)


def best_k(
    costs: CostModel, per_token: float, concurrency: int, ks: list[int]
) -> tuple[int, float]:
    """For a uniform per-token acceptance, the k of `ks` with the highest predicted speedup."""
    scored = [
        (model.tokens_per_step_uniform(per_token, k) / costs.cost(k, concurrency), k) for k in ks
    ]
    value, k = max(scored)
    return k, value


def unusable_because(
    calibration: Calibration, cluster: str, image: str, serve_fingerprint: str
) -> str | None:
    """Why a stored calibration must not predict for this serve configuration, or None."""
    measured = f"the calibration of {calibration.date}"
    if calibration.cluster != cluster:
        return f"{measured} is of cluster {calibration.cluster}, not {cluster}"
    if calibration.image != image:
        return f"{measured} was measured on image {calibration.image}, this plan serves {image}"
    if calibration.serve_fingerprint != serve_fingerprint:
        return (
            f"{measured} was measured with another serve configuration (vLLM arguments, "
            "replicas or GPUs changed since)"
        )
    if not calibration.points:
        return f"{measured} has no measured levels yet"
    return None
