"""What an estimate is, apart from how it is made (plan/estimates.py): a finished run's measured
rate, one stage's estimate with its spread, GPU-hours and money, and a lifecycle of stages with
its chart. Plain values: the plan's model holds them, the CLI prints them."""

from __future__ import annotations

import math
from dataclasses import dataclass

PRIOR_SPREAD = (0.5, 2.0)
MEASURED_SPREAD = (0.8, 1.25)


@dataclass(frozen=True)
class MeasuredRate:
    """What one finished run of a workload measured on its cluster."""

    workload: str
    unit: str
    rate: float
    """Units per second while working (its progress events' rate)."""
    startup_s: float | None
    """Its engine's start, where it started one."""
    wall_s: float
    gpus: int
    run_id: str
    measured_at: str
    predicted_s: float | None = None
    """What the run's plan predicted, for `status`'s predicted against actual."""
    units_per_sample: float | None = None
    """For a stage counted in something other than samples (extraction's tokens): how many it
    found per sample, which replaces the config's planning figure (expected_tokens_per_sample)."""

    def to_dict(self) -> dict[str, object]:
        return {
            "predicted_s": self.predicted_s,
            "units_per_sample": self.units_per_sample,
            "workload": self.workload,
            "unit": self.unit,
            "rate": self.rate,
            "startup_s": self.startup_s,
            "wall_s": self.wall_s,
            "gpus": self.gpus,
            "run_id": self.run_id,
            "measured_at": self.measured_at,
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> MeasuredRate | None:
        """None for an entry of the wrong shape (the store is a ConfigMap others can write)."""
        try:
            rate = float(data["rate"])  # type: ignore[arg-type]
            startup = data.get("startup_s")
            predicted = data.get("predicted_s")
            per_sample = data.get("units_per_sample")
            found = cls(
                workload=str(data["workload"]),
                unit=str(data["unit"]),
                rate=rate,
                startup_s=float(startup) if isinstance(startup, int | float) else None,
                wall_s=float(data.get("wall_s") or 0.0),  # type: ignore[arg-type]
                gpus=int(data.get("gpus") or 0),  # type: ignore[call-overload]
                run_id=str(data.get("run_id") or ""),
                measured_at=str(data.get("measured_at") or ""),
                predicted_s=float(predicted) if isinstance(predicted, int | float) else None,
                units_per_sample=(
                    float(per_sample)
                    if isinstance(per_sample, int | float) and per_sample > 0
                    else None
                ),
            )
        except (KeyError, TypeError, ValueError):
            return None
        return found if math.isfinite(rate) and rate > 0 else None


@dataclass(frozen=True)
class StageEstimate:
    """One stage: `units` at `rate` after `startup_s`, on `gpus` GPUs."""

    workload: str
    units: float
    unit: str
    rate: float
    startup_s: float
    gpus: int
    source: str
    measured: bool
    detail: str
    samples: int | None = None
    """The samples `units` were counted from (samples x a planning figure per sample), where
    the unit is not samples itself."""

    @property
    def seconds(self) -> float:
        return self.startup_s + self.units / self.rate

    @property
    def spread(self) -> tuple[float, float]:
        return MEASURED_SPREAD if self.measured else PRIOR_SPREAD

    @property
    def low_s(self) -> float:
        return self.seconds * self.spread[0]

    @property
    def high_s(self) -> float:
        return self.seconds * self.spread[1]

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.seconds / 3600

    def money(self, price: float | None) -> float | None:
        return None if price is None else self.gpu_hours * price

    def line(self, price: float | None) -> str:
        """The plan's `estimate` fact."""
        cost = self.money(price)
        money = f", {money_text(cost)} at {money_text(price)}/GPU-hour" if cost is not None else ""
        gpus = f"{self.gpu_hours:,.1f} GPU-hours on {self.gpus} GPUs" if self.gpus else "no GPU"
        return (
            f"about {span(self.seconds)} ({span(self.low_s)} to {span(self.high_s)}), {gpus}"
            f"{money}: {self.detail}; {self.source}"
        )

    def to_dict(self, price: float | None) -> dict[str, object]:
        return {
            "workload": self.workload,
            "seconds": round(self.seconds, 1),
            "low_s": round(self.low_s, 1),
            "high_s": round(self.high_s, 1),
            "startup_s": round(self.startup_s, 1),
            "units": self.units,
            "unit": self.unit,
            "rate": self.rate,
            "gpus": self.gpus,
            "gpu_hours": round(self.gpu_hours, 3),
            "money": None if price is None else round(self.gpu_hours * price, 2),
            "source": self.source,
            "measured": self.measured,
            "detail": self.detail,
        }


def span(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"{minutes} min"
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest:02d} min"


def money_text(amount: float | None) -> str:
    return "" if amount is None else f"${amount:,.2f}" if amount < 100 else f"${amount:,.0f}"


@dataclass(frozen=True)
class Lifecycle:
    """Stages one after another on one cluster: their estimates, the total and the money."""

    cluster: str
    stages: tuple[StageEstimate, ...]
    price: float | None
    notes: tuple[str, ...] = ()
    cluster_gpus: int = 0
    """Every GPU of the cluster: a rented one bills them all while it is held."""

    def held(self) -> str:
        """What holding the whole cluster for the lifecycle costs (a rental bills every GPU)."""
        hours = self.cluster_gpus * self.seconds / 3600
        cost = f", {money_text(hours * self.price)}" if self.price is not None else ""
        return (
            f"holding all {self.cluster_gpus} GPUs for {span(self.seconds)}: {hours:,.0f} "
            f"GPU-hours{cost} (the stages use {self.gpu_hours:,.0f}; a rental bills every GPU "
            "while it is held)"
        )

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.stages)

    @property
    def high_s(self) -> float:
        return sum(s.high_s for s in self.stages)

    @property
    def low_s(self) -> float:
        return sum(s.low_s for s in self.stages)

    @property
    def gpu_hours(self) -> float:
        return sum(s.gpu_hours for s in self.stages)

    def rows(self) -> list[dict[str, str]]:
        rows = []
        start = 0.0
        for stage in self.stages:
            cost = stage.money(self.price)
            rows.append({
                "stage": stage.workload,
                "starts": f"+{span(start)}",
                "takes": f"{span(stage.seconds)} ({span(stage.low_s)}-{span(stage.high_s)})",
                "GPUs": str(stage.gpus),
                "GPU-hours": f"{stage.gpu_hours:,.1f}",
                "money": money_text(cost) if cost is not None else "-",
                "source": "measured" if stage.measured else "prior",
            })  # fmt: skip
            start += stage.seconds
        cost = None if self.price is None else self.gpu_hours * self.price
        rows.append({
            "stage": "total", "starts": "", "takes":
            f"{span(self.seconds)} ({span(self.low_s)}-{span(self.high_s)})",
            "GPUs": "", "GPU-hours": f"{self.gpu_hours:,.1f}",
            "money": money_text(cost) if cost is not None else "-", "source": "",
        })  # fmt: skip
        return rows

    def to_dict(self) -> dict[str, object]:
        return {
            "cluster": self.cluster,
            "stages": [s.to_dict(self.price) for s in self.stages],
            "seconds": round(self.seconds, 1),
            "low_s": round(self.low_s, 1),
            "high_s": round(self.high_s, 1),
            "gpu_hours": round(self.gpu_hours, 3),
            "money": None if self.price is None else round(self.gpu_hours * self.price, 2),
            "price_per_gpu_hour": self.price,
            "cluster_gpus": self.cluster_gpus,
            "held_gpu_hours": round(self.cluster_gpus * self.seconds / 3600, 3),
            "notes": list(self.notes),
        }

    def svg(self) -> str:
        """The stages on a time axis, each bar as long as its estimate with its spread drawn as
        a thin line, labelled with its GPUs and GPU-hours (a file beside the text output)."""
        width, left, row_h, top = 880, 110, 34, 46
        total = max(self.high_s, 1.0)
        scale = (width - left - 30) / total
        height = top + row_h * len(self.stages) + 50
        colours = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#9d755d")
        money = (
            f", {money_text(self.gpu_hours * self.price)} at {money_text(self.price)}/GPU-hour"
            if self.price is not None
            else ""
        )
        parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="sans-serif" font-size="12">',
            f'<text x="10" y="20" font-size="14" font-weight="bold">Lifecycle on '
            f"{_xml(self.cluster)}: about {span(self.seconds)}, {self.gpu_hours:,.0f} GPU-hours"
            f"{_xml(money)}</text>",
        ]
        start = 0.0
        for index, stage in enumerate(self.stages):
            y = top + index * row_h
            x = left + start * scale
            colour = colours[index % len(colours)]
            parts += [
                f'<text x="10" y="{y + 17}">{_xml(stage.workload)}</text>',
                f'<line x1="{x + stage.low_s * scale:.1f}" y1="{y + 13}" '
                f'x2="{x + stage.high_s * scale:.1f}" y2="{y + 13}" stroke="{colour}" '
                f'stroke-width="2" stroke-opacity="0.5"/>',
                f'<rect x="{x:.1f}" y="{y + 4}" width="{max(stage.seconds * scale, 1):.1f}" '
                f'height="18" fill="{colour}"/>',
                f'<text x="{x + max(stage.seconds * scale, 1) + 6:.1f}" y="{y + 17}">'
                f"{span(stage.seconds)}, {stage.gpus} GPUs, {stage.gpu_hours:,.1f} GPU-h"
                f"{' (measured)' if stage.measured else ''}</text>",
            ]
            start += stage.seconds
        axis_y = top + row_h * len(self.stages) + 10
        parts.append(
            f'<line x1="{left}" y1="{axis_y}" x2="{width - 30}" y2="{axis_y}" stroke="#333"/>'
        )
        hours = total / 3600
        step = next(s for s in (0.25, 0.5, 1, 2, 4, 8, 12, 24, 48, 96, 1e9) if hours / s <= 10)
        tick = 0.0
        while tick <= hours + 1e-9:
            x = left + tick * 3600 * scale
            parts += [
                f'<line x1="{x:.1f}" y1="{axis_y}" x2="{x:.1f}" y2="{axis_y + 5}" stroke="#333"/>',
                f'<text x="{x:.1f}" y="{axis_y + 18}" text-anchor="middle">{tick:g} h</text>',
            ]
            tick += step
        parts.append("</svg>")
        return "\n".join(parts) + "\n"


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def serve_cycles(
    name: str, bench: StageEstimate, start_s: float, *, loads: int, benches: float, detail: str
) -> StageEstimate:
    """A bake-off or a calibration: `loads` serve engine starts and `benches` bench runs."""
    seconds = benches * bench.seconds
    return StageEstimate(
        name, benches * bench.units, bench.unit, benches * bench.units / seconds,
        loads * start_s, bench.gpus, bench.source, bench.measured, detail,
    )  # fmt: skip
