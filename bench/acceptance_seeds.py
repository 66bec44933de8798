"""Do the known mistakes lower what vLLM counts for every training seed, not only the tier's?

Run: .venv/bin/python bench/acceptance_seeds.py [SEED ...]   (default: 0 1 2)

For each seed, one run of the pipeline tier's acceptance test
(tests/pipeline/test_acceptance.py: real vLLM 0.32 on CPU, the informative target) and of the
doctor's paired measurement of the convention mistake (tests/pipeline/test_doctor.py) with every
drafter trained under `train.seed=SEED` (conftest's KIMIDEPLOY_PIPELINE_TRAIN_SEED); the target,
the conversations and the features are the same in every run (the target is cached by version;
datagen and extraction are greedy). Printed per seed: the mean acceptance length vLLM counted
for the correct drafter and for each mistake (k=3, greedy, held-out code prompts, the maximum is
4), the gap to the correct drafter, the held-out length training predicted for the correct
one, and the convention mistake's paired cost on the replay both ways; then the smallest gap of
each mistake over the seeds next to the margin the test asserts. About 16 minutes a seed on
two cores, alone. The tests' verdict per seed is printed too: a seed whose run failed shows which
assertion, and its directory (pytest's report, every server's log) is kept and named.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from tests.pipeline.conftest import SERVED_MISTAKES, TRAIN_SEED_VARIABLE  # noqa: E402
from tests.pipeline.test_acceptance import MARGIN  # noqa: E402

TESTS = (
    "tests/pipeline/test_acceptance.py::"
    "test_the_correct_drafter_beats_every_known_mistake_on_the_engine",
    "tests/pipeline/test_doctor.py::"
    "test_the_convention_mistakes_cost_is_measured_paired_on_the_replay",
)
COUNTED = "acceptance length, {} (k=3, greedy, held-out code)"
PREDICTED = "good: held-out mean acceptance length (k=1,2,3)"
PAIRED = {
    "layers +1": "convention, replay k=3: shifted (+1) cost, 95%",
    "layers -1": "convention, replay k=3: good fed -1, 95%",
}
"""The convention mistake both ways, paired on the replay (test_doctor.py): the cost and its
95% interval, which no margin on the engine's count can resolve at this size."""


def run_seed(seed: int) -> dict[str, object]:
    """One run of the acceptance test under `seed`: the figures it collected and its verdict."""
    tmp = Path(tempfile.mkdtemp(prefix=f"acceptance-seed{seed}-"))
    figures = tmp / "figures.json"
    env = {
        **os.environ,
        TRAIN_SEED_VARIABLE: str(seed),
        "KIMIDEPLOY_PIPELINE_FIGURES": str(figures),
    }
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"--basetemp={tmp}/pytest", *TESTS],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    measured = json.loads(figures.read_text()) if figures.is_file() else {}
    failure = ""
    if done.returncode != 0:
        # Kept whole for the diagnosis: pytest's report and every server's log under pytest/.
        (tmp / "pytest.log").write_text(done.stdout + done.stderr)
        lines = [line for line in done.stdout.splitlines() if line.startswith("E ")]
        failure = " | ".join(lines[:3]) or done.stdout[-300:]
        failure += f" | kept: {tmp}"
    else:
        shutil.rmtree(tmp)
    return {
        "counted": {
            name: measured.get(COUNTED.format(name)) for name in ("good", *SERVED_MISTAKES)
        },
        "predicted": measured.get(PREDICTED),
        "paired": {name: measured.get(key) for name, key in PAIRED.items()},
        "seconds": round(time.perf_counter() - started),
        "failure": failure,
    }


def main(argv: list[str]) -> int:
    seeds = [int(a) for a in argv] or [0, 1, 2]
    runs = {}
    names = ("good", *SERVED_MISTAKES)
    print(f"{'seed':>4} " + " ".join(f"{n:>15}" for n in names) + "   predicted good (k=1,2,3)")
    for seed in seeds:
        run = runs[seed] = run_seed(seed)
        counted = run["counted"]
        assert isinstance(counted, dict)
        good = counted["good"]
        cells = []
        for name in names:
            value = counted[name]
            if value is None:
                cells.append(f"{'-':>15}")
            elif name == "good" or good is None:
                cells.append(f"{value:>15.2f}")
            else:
                cells.append(f"{value:>7.2f} ({value - good:+.2f})")
        verdict = "passed" if not run["failure"] else f"FAILED: {run['failure']}"
        print(f"{seed:>4} " + " ".join(cells) + f"   {run['predicted']}   ({run['seconds']} s, "
              f"{verdict})")  # fmt: skip
    print("the convention mistake paired on the replay (cost at k=3 [95% interval] over turns):")
    for seed, run in runs.items():
        paired = run["paired"]
        assert isinstance(paired, dict)
        print(f"{seed:>4} " + "   ".join(f"{name}: {paired[name]}" for name in PAIRED))
    print("smallest gap to the correct drafter over the seeds (the test asserts at least):")
    for name in SERVED_MISTAKES:
        gaps = []
        for run in runs.values():
            counted = run["counted"]
            assert isinstance(counted, dict)
            if counted["good"] is not None and counted[name] is not None:
                gaps.append(counted["good"] - counted[name])
        asserted = f"{MARGIN[name]:.2f}" if name in MARGIN else "not asserted (see the test)"
        smallest = f"{min(gaps):.2f}" if gaps else "-"
        print(f"  {name:15} {smallest:>6}   {asserted}")
    return 1 if any(run["failure"] for run in runs.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
