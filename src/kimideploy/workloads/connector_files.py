"""The files vLLM's ExampleHiddenStatesConnector writes, read safely (extraction, online training).

vLLM 0.32's connector writes each request's `<storage>/<request id>.safetensors` on a thread after
the reply has gone out; it creates `<file>.lock` before the reply and holds an exclusive flock on it
until the write is done. Reading as soon as the reply names the path (what a 0.18-era reader did)
can see a missing or half-written file, and deleting only the data file leaves one lock file per
sample behind (500K on a large run). So: wait for a shared lock, read, remove both.
"""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import Any


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def exists(path: Path) -> bool:
    """The file is there or on its way (its lock exists)."""
    return path.is_file() or lock_path(path).is_file()


def read(path: Path) -> dict[str, Any]:
    """The tensors, once the writer has released the lock (immediately when there is none)."""
    from safetensors.torch import load_file

    lock = lock_path(path)
    if not lock.is_file():
        return dict(load_file(str(path)))
    with lock.open("rb") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)  # sleeps until the writer's exclusive lock is gone
        return dict(load_file(str(path)))


def remove(path: Path) -> None:
    path.unlink(missing_ok=True)
    lock_path(path).unlink(missing_ok=True)


def discard(path: Path) -> None:
    """Remove a file nobody reads (a generation request's), once its writer is done with it."""
    lock = lock_path(path)
    if lock.is_file():
        with lock.open("rb") as handle:
            fcntl.flock(handle, fcntl.LOCK_SH)
    remove(path)
