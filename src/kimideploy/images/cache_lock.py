"""One builder at a time for a cache entry that cannot be built aside and renamed into place.

A venv records its own absolute path (the scripts' shebangs, pyvenv.cfg), so it is built where it
will live; two test sessions asking for it at once (two terminals, a CI run beside a developer's
tests) would otherwise run two pips into the same folder, and one reads the other's half-written
metadata. The second waits on the lock, then finds the entry complete.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def building(entry: Path) -> Iterator[None]:
    """Held while `entry` is built or completed; the lock file sits beside it."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    with (entry.parent / f"{entry.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
