"""Where a test run's time went, printed at the end of every run: the build steps scripts/test
recorded ($KIMIDEPLOY_TIMINGS: start, end, exit code), each test tier's share of pytest's time
(setup, call and teardown of its tests, session fixtures included where they ran), and the
slowest tests. A regression shows up in the run that causes it, not in a CI limit weeks later.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

TIERS = ("unit", "render", "images", "integration", "workloads", "pipeline")
SLOWEST = 10


class Timing:
    def __init__(self) -> None:
        self.started = time.time()
        self.by_test: dict[str, float] = defaultdict(float)

    def add(self, nodeid: str, seconds: float) -> None:
        self.by_test[nodeid] += seconds

    def tiers(self) -> dict[str, float]:
        totals: dict[str, float] = defaultdict(float)
        for nodeid, seconds in self.by_test.items():
            parts = nodeid.split("/")
            tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"
            totals[tier] += seconds
        return dict(totals)

    def lines(self) -> list[str]:
        out = []
        steps = build_steps()
        origin = min((s["start"] for s in steps), default=self.started)
        if steps:
            out.append(f"{'step':48} {'from':>7} {'seconds':>8}  exit")
            for s in steps:
                seconds = s["end"] - s["start"]
                out.append(
                    f"{s['step'][:48]:48} {s['start'] - origin:>7.0f} {seconds:>8.0f}  {s['rc']}"
                )
        wall = time.time() - self.started
        out.append(f"{'tests (pytest, wall)':48} {self.started - origin:>7.0f} {wall:>8.0f}")
        tiers = self.tiers()
        for tier in [*TIERS, *sorted(set(tiers) - set(TIERS))]:
            if tier in tiers:
                out.append(f"  {'tier ' + tier:46} {'':>7} {tiers[tier]:>8.0f}")
        if steps:
            out.append(
                f"{'total so far (first step to now)':48} {'':>7} {time.time() - origin:>8.0f}"
            )
        out.append(f"slowest {SLOWEST} tests (setup + call + teardown):")
        for nodeid, seconds in sorted(self.by_test.items(), key=lambda kv: -kv[1])[:SLOWEST]:
            out.append(f"  {seconds:>7.1f}  {nodeid}")
        return out


def build_steps() -> list[dict[str, Any]]:
    path = os.environ.get("KIMIDEPLOY_TIMINGS")
    if not path or not Path(path).is_file():
        return []
    steps = []
    for line in Path(path).read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("step") != "tests: pytest":  # this run: measured here, not yet ended
            steps.append(record)
    return steps
