"""CLI start-up: `kimideploy --help` and `render serve` against a bare interpreter, side by side.

Run: .venv/bin/python bench/cli_startup.py [--runs N]. Prints the median wall time of each command
and its ratio to `python -c pass` measured in the same interleaved run (this machine is noisy, so
ratios are the figure to quote). Target: `--help` under 0.3 s.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KIMIDEPLOY = [sys.executable, "-m", "kimideploy"]
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "kimideploy --help": [*KIMIDEPLOY, "--help"],
    "kimideploy drafter list": [*KIMIDEPLOY, "drafter", "list"],
    "kimideploy render serve --drafter v3": [*KIMIDEPLOY, "render", "serve", "--drafter", "v3"],
}


def wall_time(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(runs):  # interleaved, so drift hits every command alike
        for name, command in COMMANDS.items():
            samples[name].append(wall_time(command))
    baseline = statistics.median(samples["python -c pass"])
    print(f"{'command':40} {'median s':>9} {'min s':>7} {'x python':>9}")
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"{name:40} {median:9.3f} {min(values):7.3f} {median / baseline:9.2f}")


if __name__ == "__main__":
    main()
