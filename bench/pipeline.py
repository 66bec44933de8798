"""The pipeline tier's figures: the EAGLE-3 lifecycle with real vLLM 0.32 (CPU build), tiny target.

Run: .venv/bin/python bench/pipeline.py [-- PYTEST ARGS]. Runs tests/pipeline/test_lifecycle.py
(the informative target, datagen against `vllm serve`, vLLM extraction, vocab, offline and online
training, then every drafter its gate test serves: the correct one, one of each known mistake,
the copy pulled on the second cluster and the model-free methods) and prints what each stage
measured: samples/s, extraction tokens/s and bytes per token, training steps/s and the held-out
lengths, vLLM start-up, and the mean acceptance length of every served drafter at k=3 on held-out
prompts (greedy), with the tier's wall time. CPU figures: for comparing runs of this tier on one
machine, not for predicting a GPU. bench/acceptance_seeds.py repeats the acceptance comparison
under other training seeds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_tier(tests: str, extra: list[str]) -> tuple[dict[str, object], float, int]:
    """Run pipeline tests under pytest: (the figures they recorded, wall seconds, exit code)."""
    with tempfile.TemporaryDirectory() as tmp:
        figures = Path(tmp) / "figures.json"
        env = {**os.environ, "KIMIDEPLOY_PIPELINE_FIGURES": str(figures)}
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", tests, *extra],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        wall = time.perf_counter() - start
        measured = json.loads(figures.read_text()) if figures.is_file() else {}
    return measured, wall, done.returncode


def main(extra: list[str]) -> int:
    measured, wall, returncode = run_tier("tests/pipeline/test_lifecycle.py", extra)
    for key, value in measured.items():
        print(f"{key:52} {value}")
    print(f"{'tier wall time (s)':52} {wall:.0f}")
    if returncode != 0:
        print(f"(the tier failed with exit {returncode}; figures are partial)", file=sys.stderr)
    return returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[2:] if sys.argv[1:2] == ["--"] else sys.argv[1:]))
