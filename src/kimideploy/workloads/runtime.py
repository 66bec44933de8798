"""What every workload shares: the spec, its shard, progress lines, logs and a graceful stop."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from kimideploy.config.specs import API_KEY_ENV, SpecModel, WorkloadExit
from kimideploy.errors import ExitCode, KimiDeployError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = (
    int(WorkloadExit.OK),
    int(WorkloadExit.FAILED),
    int(WorkloadExit.BAD_INPUT),
    int(WorkloadExit.INTERRUPTED),
)
Spec = TypeVar("Spec", bound=SpecModel)


class BadInputError(KimiDeployError):
    """The spec or the input data cannot be used (exit 2)."""

    exit_code = ExitCode.USAGE


def load_spec(path: Path, model: type[Spec]) -> Spec:
    """The same model the renderer wrote; unknown keys from a newer CLI are ignored."""
    try:
        return model.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError, ValidationError) as exc:
        raise BadInputError(f"cannot use the spec {path}: {exc}") from exc


def json_request_headers() -> dict[str, str]:
    """For calls to the serve release: its API key, when the pod was given one."""
    headers = {"Content-Type": "application/json"}
    key = os.environ.get(API_KEY_ENV, "")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return headers


def shard_index() -> int:
    """This pod's shard: the Indexed Job's completion index (0 when run by hand)."""
    return int(os.environ.get("JOB_COMPLETION_INDEX", "0"))


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def emit(event: dict[str, Any]) -> None:
    """One machine event per stdout line (the CLI's progress bar reads these).

    The line and its newline go out in one write: the training launcher's ranks share one stdout
    (the pod's log), and print() under the images' PYTHONUNBUFFERED=1 writes a text and its
    newline apart, so two ranks' events could merge into one line no parser reads. A pipe keeps
    one write of up to PIPE_BUF (4 KiB) whole."""
    line = (json.dumps(event, sort_keys=True) + "\n").encode()
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a captured stdout (tests) has no descriptor
        sys.stdout.write(line.decode())
        sys.stdout.flush()
        return
    sys.stdout.flush()
    view = memoryview(line)
    while view:
        view = view[os.write(fd, view) :]


class Progress:
    """done/total/rate/ETA lines, at most every `every_s` seconds (and always at the end)."""

    def __init__(
        self, stage: str, unit: str, total: int, already: int = 0, every_s: float = 2.0
    ) -> None:
        self.stage, self.unit, self.total = stage, unit, total
        self.done, self.start_done = already, already
        self.start, self.last, self.every_s = time.monotonic(), 0.0, every_s

    def advance(self, count: int = 1, force: bool = False, **extra: Any) -> None:
        self.done += count
        now = time.monotonic()
        if force or now - self.last >= self.every_s or self.done >= self.total:
            self.last = now
            rate = (self.done - self.start_done) / max(now - self.start, 1e-6)
            eta = (self.total - self.done) / rate if rate > 0 else None
            emit(
                {
                    "event": "progress",
                    "stage": self.stage,
                    "shard": shard_index(),
                    "done": self.done,
                    "total": self.total,
                    "unit": self.unit,
                    "rate": round(rate, 4),
                    "eta_s": round(eta, 1) if eta is not None else None,
                    **extra,
                }
            )


class Stopper:
    """SIGTERM (pod eviction, preemption) asks the workload to finish its unit and flush."""

    def __init__(self) -> None:
        self.stopping = False
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)

    def _stop(self, signum: int, frame: Any) -> None:
        if not self.stopping:
            log(f"received signal {signum}: finishing the current work, then exiting to resume")
        self.stopping = True


class DiskFullError(KimiDeployError):
    """The volume has no room for what must be written (exit 1: free space, then resume)."""


TEMP_MARK = ".tmp-"


def atomic_write(path: Path, data: bytes) -> None:
    """Write next to the target, fsync, rename: a reader never sees half a file. A full disk
    leaves nothing behind and says how much room there is."""
    tmp = path.with_name(f".{path.name}{TEMP_MARK}{os.getpid()}")
    try:
        with tmp.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            free = shutil.disk_usage(path.parent).free
            raise DiskFullError(
                f"no space left in {path.parent} to write {path.name} ({len(data):,} bytes; "
                f"{free:,} bytes free); nothing half-written was left",
                hint="free space or grow the volume's claim, then run again: it resumes",
            ) from exc
        raise


def remove_dead_temporaries(folder: Path) -> list[str]:
    """Half-written files of a writer that died (a kill between write and rename); call only
    while holding the folder's writer lock."""
    removed = []
    for leftover in folder.glob(f".*{TEMP_MARK}*"):
        if leftover.is_file() and not leftover.is_symlink():
            leftover.unlink(missing_ok=True)
            removed.append(leftover.name)
    return removed


WRITE_PROBE = ".kimideploy-write-probe"


def require_writable(folders: list[str]) -> None:
    """Create each folder and a file in it, then remove the file: a folder the pod's user cannot
    write (a host path created root-owned, a read-only volume) is a refusal before any work,
    naming the folder, its owner and this process's user."""
    for folder in folders:
        path = Path(folder)
        probe = path / f"{WRITE_PROBE}-{os.getpid()}"
        # The folders made only to probe go again: a run refused later leaves nothing behind.
        made = [p for p in (path, *path.parents) if not p.exists()]
        try:
            path.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            os.close(descriptor)
            probe.unlink()
            for created in made:
                created.rmdir()
        except OSError as exc:
            raise BadInputError(
                f"{folder} cannot be written by uid {os.getuid()} ({exc.strerror}; "
                f"{_owner(path)}): everything this run makes would be lost at the first write",
                hint="give the folder to the pods' user (on the PCIe host `kimideploy host "
                "provision` makes the models volume's drafters/ theirs), or mount a writable "
                "volume there",
            ) from exc


def _owner(path: Path) -> str:
    """Who owns the nearest folder that exists, as the refusal shows it."""
    for candidate in (path, *path.parents):
        try:
            found = candidate.stat()
        except OSError:
            continue
        read_only = ", read-only filesystem" if _read_only(candidate) else ""
        return f"{candidate} is uid {found.st_uid}, mode {found.st_mode & 0o7777:o}{read_only}"
    return "no part of the path exists"


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False
