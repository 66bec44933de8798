"""The workloads' progress protocol: one JSON object per stdout line, aggregated across indexes.

    {"event": "progress", "stage": "datagen", "done": 1200, "total": 10000, "unit": "samples",
     "rate": 0.55, "eta_s": 16000}
    {"event": "result", ...}

Anything else on a line is a human log line and is ignored here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


def parse_events(text: str) -> list[dict[str, Any]]:
    """The machine events in a log text, in order; non-JSON lines are skipped."""
    events = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and isinstance(event.get("event"), str):
            events.append(event)
    return events


@dataclass(frozen=True)
class Progress:
    stage: str
    unit: str
    done: float
    total: float
    rate: float
    reporting: int
    indexes: int

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0

    @property
    def eta_s(self) -> float | None:
        return (self.total - self.done) / self.rate if self.rate > 0 else None

    def describe(self) -> str:
        eta = self.eta_s
        eta_text = f", ETA {duration(eta)}" if eta is not None else ""
        return (
            f"{self.stage}: {self.done:,.0f}/{self.total:,.0f} {self.unit} ({self.fraction:.0%}), "
            f"{self.rate:,.2f} {self.unit}/s{eta_text} "
            f"[{self.reporting}/{self.indexes} indexes reporting]"
        )


def aggregate(logs: dict[int, str], indexes: int) -> Progress | None:
    """Sum the latest progress event of each index (shards work in parallel, so rates add up)."""
    latest = {}
    for index, text in logs.items():
        progress = [e for e in parse_events(text) if e["event"] == "progress"]
        if progress:
            latest[index] = progress[-1]
    if not latest:
        return None
    first = next(iter(latest.values()))
    return Progress(
        stage=str(first.get("stage", "")),
        unit=str(first.get("unit", "items")),
        done=sum(float(e.get("done", 0)) for e in latest.values()),
        total=sum(float(e.get("total", 0)) for e in latest.values()),
        rate=sum(float(e.get("rate", 0)) for e in latest.values()),
        reporting=len(latest),
        indexes=indexes,
    )


def results(logs: dict[int, str]) -> dict[int, dict[str, Any]]:
    """The last `result` event of each index."""
    found = {}
    for index, text in logs.items():
        matched = [e for e in parse_events(text) if e["event"] == "result"]
        if matched:
            found[index] = matched[-1]
    return found


def duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"
