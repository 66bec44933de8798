"""One writer per shard folder on a shared volume, even across pods, nodes and Jobs.

A second run of the same shard (the user pressed Ctrl-C, which detaches, and ran again while the
first Job kept running) would write the same samples twice. The first writer creates
`.writer.lock` exclusively and bumps a heartbeat counter in it every HEARTBEAT_S seconds. Another
writer that finds the lock watches that counter, not file times: pods on other nodes have other
clocks, and a volume's mtimes are the server's. If the counter moves within STALE_S, a live
writer holds the shard and this one is refused (exit 2, naming it); if it does not, the holder is
dead (an evicted pod), and the lock is taken over: renamed aside atomically, so of two
contenders only one wins, then created again exclusively.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from kimideploy.workloads.runtime import BadInputError, log

LOCK_NAME = ".writer.lock"
HEARTBEAT_S = 5.0
STALE_S = 30.0
STALE_ENV = "KIMIDEPLOY_WRITER_STALE_S"
"""Overrides STALE_S (tests; a volume with slow metadata)."""


def _identity() -> str:
    pod = os.environ.get("HOSTNAME") or socket.gethostname()
    return f"{pod} pid {os.getpid()}"


class WriterLock:
    def __init__(self, folder: Path, what: str) -> None:
        self.path, self.what = folder / LOCK_NAME, what
        self.identity = _identity()
        self.stale_s = float(os.environ.get(STALE_ENV, STALE_S))
        self.heartbeat_s = min(HEARTBEAT_S, self.stale_s / 4)
        self.beats = 0
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def __enter__(self) -> WriterLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _write_new(self) -> bool:
        """Create the lock exclusively; False when another writer has it."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as handle:
            json.dump({"holder": self.identity, "beats": 0}, handle)
        return True

    def _read(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {"holder": "unknown (unreadable lock)", "beats": None}
        return data if isinstance(data, dict) else {"holder": "unknown", "beats": None}

    def acquire(self) -> None:
        deadline = time.monotonic() + self.stale_s
        seen = self._read()
        while not self._write_new():
            time.sleep(min(self.heartbeat_s, 1.0))
            now = self._read()
            if now is None:
                continue  # released meanwhile: try again
            if seen is not None and now.get("beats") != seen.get("beats"):
                raise BadInputError(
                    f"{self.what} is being written by {now.get('holder')} (its heartbeat moved "
                    "just now); a second writer would duplicate samples, so this one stops",
                    hint="wait for that run to finish (`kimideploy status` lists runs), or stop "
                    "it first; a run resumes where the other stopped",
                )
            seen = now if seen is None else seen
            if time.monotonic() >= deadline:
                self._take_over(now)
                deadline = time.monotonic() + self.stale_s
        log(f"{self.what}: writing as {self.identity}")
        self.thread = threading.Thread(target=self._heartbeat, daemon=True)
        self.thread.start()

    def _take_over(self, stale: dict[str, Any]) -> None:
        aside = self.path.with_name(f"{LOCK_NAME}.stale-{os.getpid()}-{time.monotonic_ns()}")
        try:
            self.path.rename(aside)  # only one contender's rename finds the file
        except FileNotFoundError:
            return
        aside.unlink(missing_ok=True)
        log(f"{self.what}: took over the lock of {stale.get('holder')}, whose heartbeat stopped")

    def _heartbeat(self) -> None:
        while not self.stop.wait(self.heartbeat_s):
            self.beats += 1
            partial = self.path.with_name(f"{LOCK_NAME}.beat-{os.getpid()}")
            try:
                partial.write_text(json.dumps({"holder": self.identity, "beats": self.beats}))
                if (self._read() or {}).get("holder") != self.identity:
                    partial.unlink(missing_ok=True)
                    return  # taken over (we looked dead): stop claiming it
                partial.replace(self.path)
            except OSError:
                continue

    def release(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=self.heartbeat_s * 2)
        if (self._read() or {}).get("holder") == self.identity:
            self.path.unlink(missing_ok=True)
