"""Machine events stay one per line when processes share a stdout: the training launcher's ranks
write into one pod log, and the CLI reads progress and results from it line by line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO

EMITTER = """
import sys
from kimideploy.workloads.runtime import emit
for i in range(int(sys.argv[2])):
    emit({"event": "progress", "rank": int(sys.argv[1]), "done": i})
"""


def test_two_ranks_emitting_at_once_never_merge_a_line() -> None:
    """Under PYTHONUNBUFFERED=1 (the images' setting) print() wrote the text and its newline
    apart, and two ranks' events merged into an unreadable line (3 runs of 3 here)."""
    read, write = os.pipe()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "PYTHONUNBUFFERED": "1"}
    count = 20000
    ranks = [subprocess.Popen([sys.executable, "-c", EMITTER, str(rank), str(count)],
                              stdout=write, env=env) for rank in (0, 1)]  # fmt: skip
    os.close(write)
    with os.fdopen(read, encoding="utf-8") as out:
        lines = out.read().splitlines()
    assert [rank.wait(timeout=120) for rank in ranks] == [0, 0]
    events = [json.loads(line) for line in lines]  # a merged line would not parse
    assert len(events) == 2 * count
    for rank in (0, 1):
        assert [e["done"] for e in events if e["rank"] == rank] == list(range(count))
