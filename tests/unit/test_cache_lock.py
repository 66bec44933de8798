"""Two sessions asking for one venv at once: the second waits for the first's build
(images/cache_lock.py), instead of running a second pip into the same folder."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO

BUILDER = """
import sys, time
from pathlib import Path
from kimideploy.images.cache_lock import building
entry, log = Path(sys.argv[1]), Path(sys.argv[2])
with building(entry):
    with log.open("a") as out:
        out.write(f"start {sys.argv[3]}\\n")
    time.sleep(0.5)
    with log.open("a") as out:
        out.write(f"end {sys.argv[3]}\\n")
"""


def test_builders_of_one_entry_take_turns(tmp_path: Path) -> None:
    entry, log = tmp_path / "venvs" / "v-1", tmp_path / "log"
    started = time.monotonic()
    builders = [
        subprocess.Popen([sys.executable, "-c", BUILDER, str(entry), str(log), name], cwd=REPO)
        for name in ("a", "b")
    ]
    assert [b.wait(timeout=60) for b in builders] == [0, 0]
    lines = log.read_text().split()
    # start X, end X, start Y, end Y: never two builds inside the lock at once.
    assert [lines[i] for i in (0, 2, 4, 6)] == ["start", "end", "start", "end"], lines
    assert lines[1] == lines[3] and lines[5] == lines[7] and lines[1] != lines[5], lines
    assert time.monotonic() - started >= 1.0
    assert (tmp_path / "venvs" / "v-1.lock").is_file()
