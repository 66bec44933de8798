"""How close the estimates come to the next run, on the engine: real vLLM 0.32 (CPU build), the
pipeline tier's target and stages.

Run: .venv/bin/python bench/estimates.py [-- PYTEST ARGS], on a machine left alone (it times
runs minutes apart, so anything else on the cores shows as error). Runs
tests/pipeline/estimate_accuracy.py: each stage's run is recorded as `run` records a finished
Job, the plan estimates the next run from it, the next run is timed, and each pair must come
within a quarter (exit 1 otherwise). Prints every pair: next run / estimate (s) and the error.
"""

from __future__ import annotations

import sys

from pipeline import run_tier  # bench/pipeline.py: this script's folder is on sys.path


def main(extra: list[str]) -> int:
    measured, wall, returncode = run_tier("tests/pipeline/estimate_accuracy.py", extra)
    for key, value in measured.items():
        if key.startswith("estimates:"):
            print(f"{key:60} {value}")
    print(f"{'wall time (s)':60} {wall:.0f}")
    if returncode != 0:
        print(f"(a pair missed the quarter, or the run failed: exit {returncode})",
              file=sys.stderr)  # fmt: skip
    return returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[2:] if sys.argv[1:2] == ["--"] else sys.argv[1:]))
