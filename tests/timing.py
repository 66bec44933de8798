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
        path = os.environ.get("KIMIDEPLOY_TIMINGS")
        if path:  # scripts/test runs the tiers in two pytest sessions; the last one sums both
            with Path(path).open("a") as handle:
                handle.write(
                    json.dumps({"test": nodeid, "seconds": seconds, "pid": os.getpid()}) + "\n"
                )

    def all_tests(self) -> dict[str, float]:
        """This session's tests and those earlier sessions of the same scripts/test recorded."""
        merged = defaultdict(float, self.by_test)
        for record in records():
            if "test" in record and record.get("pid") != os.getpid():
                merged[record["test"]] += float(record["seconds"])
        return dict(merged)

    def tiers(self) -> dict[str, float]:
        totals: dict[str, float] = defaultdict(float)
        for nodeid, seconds in self.all_tests().items():
            parts = nodeid.split("/")
            tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"
            totals[tier] += seconds
        return dict(totals)

    def lines(self, session: bool = True) -> list[str]:
        """The table; `session` adds this pytest session's own wall time (False: scripts/test's
        closing table, printed after every session has ended)."""
        out = []
        steps = build_steps()
        origin = min((s["start"] for s in steps), default=self.started)
        if steps:
            out.append(f"{'step':48} {'from':>7} {'seconds':>8}  exit {'cpu s':>7} {'cores':>5}")
            for s in steps:
                seconds = s["end"] - s["start"]
                cpu = s.get("cpu")
                used = "" if cpu is None else f"{cpu:>7.0f} {cpu / max(seconds, 1e-9):>5.2f}"
                out.append(
                    f"{s['step'][:48]:48} {s['start'] - origin:>7.0f} {seconds:>8.0f}  "
                    f"{s['rc']:<4} {used}".rstrip()
                )
        if session:
            wall = time.time() - self.started
            out.append(
                f"{'tests (this pytest session, wall)':48} {self.started - origin:>7.0f} {wall:>8.0f}"
            )
        tiers = self.tiers()  # every session of this scripts/test run
        for tier in [*TIERS, *sorted(set(tiers) - set(TIERS))]:
            if tier in tiers:
                out.append(f"  {'tier ' + tier:46} {'':>7} {tiers[tier]:>8.0f}")
        if steps:
            wall = time.time() - origin
            out.append(f"{'total so far (first step to now)':48} {'':>7} {wall:>8.0f}")
            out.extend(busy_line(steps, wall))
        out.append(f"slowest {SLOWEST} tests (setup + call + teardown):")
        for nodeid, seconds in sorted(self.all_tests().items(), key=lambda kv: -kv[1])[:SLOWEST]:
            out.append(f"  {seconds:>7.1f}  {nodeid}")
        return out


def busy_line(steps: list[dict[str, Any]], wall: float) -> list[str]:
    """How much of the machine the ended steps used: their CPU seconds over what the cores
    offered in the run's wall time (idle cores are room to run more at once; a full machine
    means only less work makes the run shorter)."""
    used = [s["cpu"] for s in steps if s.get("cpu") is not None]
    cores = os.cpu_count() or 1
    if not used or wall <= 0:
        return []
    share = sum(used) / (cores * wall)
    return [
        f"cpu used by the steps: {sum(used):.0f} s of {cores * wall:.0f} s on {cores} cores "
        f"({share:.0%})"
    ]


def records() -> list[dict[str, Any]]:
    path = os.environ.get("KIMIDEPLOY_TIMINGS")
    if not path or not Path(path).is_file():
        return []
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def build_steps() -> list[dict[str, Any]]:
    """The steps scripts/test recorded so far (this pytest session's own is not yet ended)."""
    return [record for record in records() if "step" in record]


def main() -> int:
    """`python tests/timing.py`: the closing table of a scripts/test run, every session's tests
    included, whichever session ended last."""
    print(f"{' where the time went (every step and session) ':=^96}")
    for line in Timing().lines(session=False):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
