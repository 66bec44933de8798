#!/usr/bin/env python3
"""Download one pinned Hugging Face revision to a local folder: parallel, resumable, verified.

Runs ON the GPU host (uploaded by `kimideploy host sync-model`), so it uses the standard library
only. The token is read from the first line of stdin, never from the command line. Progress is
printed as JSON lines on stdout (bytes, bytes/s and ETA for the whole revision); human messages
go to stderr.

Parallel: a hub or mirror limits what one connection carries far below a host's link, so up to
`--streams` connections run at once, over several files and over byte ranges ("pieces") of large
files. Each file is written in place (`NAME.part`, its full size allocated up front) and each
piece's progress is recorded in `NAME.part.journal` after the bytes it covers are on disk
(fdatasync first), so a kill at any point loses at most the last unrecorded RECORD_EVERY bytes
of each piece in flight: a restart fetches every piece from its recorded offset, none twice and
none missed. A server that ignores ranges gets one sequential stream for that file.

Verified: each file's sha256 (LFS) or git blob id is checked before it is renamed into place,
and the completion marker is written only when every file is verified. A response is read only
up to the size the listing gives; a body longer than that is refused (exit 3).

Links: whoever can write the destination (pods, once it is writable to their uid) must not
choose which file of the syncing user is written. Every file the downloader writes (`.part`, its
journal, the verified list, the completion marker, the lock) is opened without following a link
(O_NOFOLLOW, or removed first and created with O_EXCL); a link found where one of them belongs is
removed (the link, never what it points at) and that file starts over; a finished file that is a
link counts as absent. One sync holds the destination at a time (an flock on its lock file).

Exit codes: 0 done, 2 refused (token, unknown revision), 3 verification failed (a file's hash or
size, or a listing that names a path outside the destination, a file without a hash or a size
that is not a byte count: refused before anything is written), 4 network error (run again to
resume), 5 another sync is writing the destination.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import hashlib
import http.client
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

MARKER = ".kimideploy-complete"
VERIFIED = ".kimideploy-verified.json"
CHUNK = 1024 * 1024
PIECE = 64 * 1024 * 1024
RECORD_EVERY = 16 * 1024 * 1024
DEFAULT_STREAMS = 8


class SameHostAuthRedirect(urllib.request.HTTPRedirectHandler):
    """Follow redirects (the hub sends large files to a CDN) but never leak the token elsewhere."""

    def redirect_request(
        self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> Any:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        old, moved = urllib.parse.urlsplit(req.full_url), urllib.parse.urlsplit(newurl)
        downgraded = old.scheme == "https" and moved.scheme != "https"
        if new is not None and (moved.netloc != old.netloc or downgraded):
            new.remove_header("Authorization")  # another host, or the token in clear text
        return new


OPENER = urllib.request.build_opener(SameHostAuthRedirect)


class Refused(Exception):  # noqa: N818 - a payload with its own small vocabulary
    """Verification failed: exit 3."""


class NoRanges(Exception):  # noqa: N818
    """The server answered a range request with the whole file."""


def request(url: str, token: str, headers: dict[str, str] | None = None) -> Any:
    all_headers = dict(headers or {})
    if token:
        all_headers["Authorization"] = f"Bearer {token}"
    return OPENER.open(urllib.request.Request(url, headers=all_headers), timeout=60)


def listing(endpoint: str, repo: str, revision: str, token: str) -> list[dict[str, Any]]:
    url = f"{endpoint}/api/models/{repo}/revision/{revision}?blobs=true"
    with request(url, token) as response:
        info = json.loads(response.read(64 * 1024 * 1024))
    if info.get("sha") and info["sha"] != revision:
        raise SystemExit(f"the hub resolved {revision} to {info['sha']}: pin a full commit hash")
    files: list[dict[str, Any]] = info.get("siblings", [])
    return files


def expected_hash(entry: dict[str, Any]) -> tuple[str, str]:
    """('sha256', hex) for LFS files, ('git-sha1', hex) for small files kept in git."""
    lfs = entry.get("lfs") or {}
    if lfs.get("sha256"):
        return "sha256", lfs["sha256"]
    return "git-sha1", entry.get("blobId", "")


def entry_size(entry: dict[str, Any]) -> int:
    lfs: dict[str, Any] = entry["lfs"] if isinstance(entry.get("lfs"), dict) else {}
    raw = lfs.get("size") if lfs.get("size") is not None else entry.get("size", 0)
    size = byte_count(raw)
    if size is None:
        raise ValueError(f"size {raw!r} is not a byte count")
    return size


OWN_SUFFIXES = (".part", ".part.journal")
LOCK = ".kimideploy-sync.lock"
OWN_FILES = (MARKER, VERIFIED, LOCK)
MAX_FILE_BYTES = 1 << 45
"""32 TiB: a listed size beyond it (or 1e400, or negative) is no byte count of a real file."""


class BusyError(Exception):
    """Another sync holds the destination."""


def drop_link(path: Path) -> None:
    """A link where a downloader file belongs: removed (the link itself); the file starts over."""
    if path.is_symlink():
        path.unlink()


def write_new(path: Path, text: str) -> None:
    """Write `path` as a new regular file: never through a link planted where it was."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def replace_with(path: Path, text: str) -> None:
    """`path` replaced whole by a new file: written beside it, then renamed over it (a rename
    replaces a link, never what it points at)."""
    partial = path.with_name(path.name + ".tmp")
    write_new(partial, text)
    partial.replace(path)


def byte_count(value: Any) -> int | None:
    """A JSON number that is a real byte count, else None (1e400, -1, "x", true)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not (value.is_integer() and 0 <= value <= MAX_FILE_BYTES):
        return None
    return int(value) if 0 <= value <= MAX_FILE_BYTES else None


def listing_problems(dest: Path, files: list[dict[str, Any]]) -> list[str]:
    """Why this listing (from the hub, or a mirror set by HF_ENDPOINT) must not be followed: file
    names become paths under `dest`, so each must stay inside it, and each file must have a hash
    to be checked against."""
    root = dest.resolve()
    problems = []
    for number, entry in enumerate(files):
        if not isinstance(entry, dict):
            problems.append(f"entry {number} of the listing is a {type(entry).__name__}")
            continue
        name = entry.get("rfilename")
        parts = PurePosixPath(name).parts if isinstance(name, str) else ()
        if (
            not isinstance(name, str)
            or not name
            or "\0" in name
            or "\\" in name
            or PurePosixPath(name).is_absolute()
            or ".." in parts
            or "." in parts
            # The folders it goes in (a link among them leads out); a link in the file's own
            # place is removed before the file is written, never followed.
            or not (root / name).parent.resolve().is_relative_to(root)
        ):
            problems.append(f"{name!r}: not a relative path inside {dest}")
            continue
        if name in OWN_FILES or name.endswith(OWN_SUFFIXES):
            problems.append(f"{name!r}: collides with the downloader's own files")
        if not expected_hash(entry)[1]:
            problems.append(f"{name!r}: the listing gives no hash (lfs.sha256 or blobId)")
        try:
            entry_size(entry)
        except (TypeError, ValueError) as exc:
            problems.append(f"{name!r}: the listing gives no usable size ({exc})")
    return problems


def file_hash(path: Path, kind: str, size: int) -> str:
    digest = hashlib.sha256() if kind == "sha256" else hashlib.sha1()
    if kind == "git-sha1":
        digest.update(f"blob {size}\0".encode())
    with path.open("rb") as handle:
        while chunk := handle.read(8 * CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def emit(event: dict[str, Any]) -> None:
    print(json.dumps(event), flush=True)


class Progress:
    """Bytes of the whole revision: done (including what earlier runs fetched), bytes/s of this
    run, ETA; printed at most once a second from any worker."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.fetched = total, 0, 0
        self.start, self.last = time.monotonic(), 0.0
        self.lock = threading.Lock()

    def present(self, count: int) -> None:
        with self.lock:
            self.done += count

    def fetched_bytes(self, count: int) -> None:
        with self.lock:
            self.done += count
            self.fetched += count
            now = time.monotonic()
            if now - self.last < 1.0 and self.done < self.total:
                return
            self.last = now
            rate = self.fetched / max(now - self.start, 1e-6)
        emit(
            {
                "event": "progress",
                "stage": "sync-model",
                "done": self.done,
                "total": self.total,
                "unit": "bytes",
                "rate": round(rate, 1),
                "eta_s": round((self.total - self.done) / rate, 1) if rate else None,
            }
        )


@dataclass
class Target:
    """One file of the listing and its in-place download: pieces and their recorded offsets."""

    name: str
    url: str
    size: int
    kind: str
    want: str
    path: Path
    piece: int = PIECE
    offsets: dict[int, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    sequential: bool = False

    @property
    def part(self) -> Path:
        return self.path.with_name(self.path.name + ".part")

    @property
    def journal(self) -> Path:
        return self.path.with_name(self.path.name + ".part.journal")

    def pieces(self) -> list[tuple[int, int]]:
        """(start, end) byte ranges, end exclusive."""
        return [(s, min(s + self.piece, self.size)) for s in range(0, self.size, self.piece)]

    def header(self) -> dict[str, Any]:
        return {"size": self.size, "hash": self.want, "piece": self.piece}

    def load(self) -> None:
        """The recorded offsets, or a fresh start when the journal is of another file (or holds
        what no journal of this file can: a piece or offset out of range, not a number)."""
        self.offsets = {}
        drop_link(self.part)
        drop_link(self.journal)
        if self.journal.is_file() and self.part.is_file():
            lines = self.journal.read_text().splitlines()
            try:
                if lines and json.loads(lines[0]) == self.header():
                    for number, line in enumerate(lines[1:], 2):
                        try:
                            raw = json.loads(line)
                        except ValueError:
                            if number == len(lines):
                                return  # cut mid-line by a kill: the earlier lines stand
                            raise
                        piece, done = self._entry(raw)
                        self.offsets[piece] = max(self.offsets.get(piece, 0), done)
                    return
            except (ValueError, TypeError, OverflowError):
                pass  # an impossible journal: nothing it records can be trusted
            self.offsets = {}
        elif self.part.is_file() and not self.journal.exists():
            # A .part from the one-stream downloader: its bytes are a valid prefix.
            self._adopt_prefix(self.part.stat().st_size)
            return
        self.part.unlink(missing_ok=True)
        self.journal.unlink(missing_ok=True)

    def _entry(self, raw: Any) -> tuple[int, int]:
        if not isinstance(raw, list) or len(raw) != 2:
            raise ValueError(f"journal entry {raw!r}")
        piece, done = raw
        pieces = self.pieces()
        if isinstance(piece, bool) or not isinstance(piece, int) or not 0 <= piece < len(pieces):
            raise ValueError(f"journal piece {piece!r}")
        start, end = pieces[piece]
        if byte_count(done) is None or done > end - start:
            raise ValueError(f"journal offset {done!r} for piece {piece}")
        return piece, int(done)

    def _adopt_prefix(self, have: int) -> None:
        have = min(have, self.size)
        write_new(self.journal, json.dumps(self.header()) + "\n")
        for number, (start, end) in enumerate(self.pieces()):
            if have > start:
                self.record(number, min(have, end) - start, sync=False)

    def open(self) -> int:
        fd = os.open(self.part, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        if os.fstat(fd).st_size != self.size:
            os.ftruncate(fd, self.size)
        if not self.journal.is_file() or self.journal.is_symlink():
            write_new(self.journal, json.dumps(self.header()) + "\n")
        return fd

    def record(self, piece: int, done: int, fd: int | None = None, sync: bool = True) -> None:
        """The bytes are on disk first, then the journal says so."""
        if fd is not None and sync:
            os.fdatasync(fd)
        with self.lock:
            self.offsets[piece] = done
            fd_journal = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
            with os.fdopen(fd_journal, "a") as journal:
                journal.write(json.dumps([piece, done]) + "\n")
                journal.flush()
                if sync:
                    os.fsync(journal.fileno())

    def remaining(self) -> list[int]:
        return [n for n, (s, e) in enumerate(self.pieces()) if self.offsets.get(n, 0) < e - s]


class Sync:
    def __init__(self, args: argparse.Namespace, token: str) -> None:
        self.args, self.token = args, token
        self.dest = Path(args.dest)
        self.piece = max(int(args.piece_bytes), CHUNK)
        self.record_every = max(int(args.record_every), 1)
        self.verified_lock = threading.Lock()
        self.stop = threading.Event()

    def fetch_piece(self, target: Target, number: int, fd: int, progress: Progress) -> None:
        start, end = target.pieces()[number]
        done = target.offsets.get(number, 0)
        if done >= end - start:
            return
        headers = {"Range": f"bytes={start + done}-{end - 1}"}
        with request(target.url, self.token, headers) as response:
            if response.status != 206:
                raise NoRanges(target.name)
            content_range = response.headers.get("Content-Range")
            self._check_total(target, content_range)
            if not self._starts_at(content_range, start + done):
                # A range answered from elsewhere: one stream for this file rather than bytes
                # in the wrong place (the hash would refuse them, on every run).
                raise NoRanges(target.name)
            recorded = done
            while done < end - start and not self.stop.is_set():
                chunk = response.read(min(CHUNK, end - start - done))
                if not chunk:
                    break
                os.pwrite(fd, chunk, start + done)
                done += len(chunk)
                progress.fetched_bytes(len(chunk))
                if done - recorded >= self.record_every:
                    target.record(number, done, fd)
                    recorded = done
            target.record(number, done, fd)
        if done < end - start and not self.stop.is_set():
            raise ConnectionError(f"{target.name}: the connection ended at byte {start + done}")

    @staticmethod
    def _starts_at(content_range: str | None, offset: int) -> bool:
        """Whether `bytes START-END/TOTAL` starts at the byte asked for."""
        unit, _, span = (content_range or "").partition(" ")
        first = span.partition("-")[0]
        return unit == "bytes" and first.isdigit() and int(first) == offset

    @staticmethod
    def _check_total(target: Target, content_range: str | None) -> None:
        total = (content_range or "").rpartition("/")[2]
        if total.isdigit() and int(total) != target.size:
            raise Refused(
                f"{target.name}: the server says the file has {total} bytes, the listing "
                f"{target.size}; refusing to write it"
            )

    def fetch_whole(self, target: Target, fd: int, progress: Progress) -> None:
        """One stream from byte 0 for a server without ranges, never past the listed size."""
        target.offsets = {}
        os.ftruncate(fd, target.size)
        write_new(target.journal, json.dumps(target.header()) + "\n")
        done = 0
        with request(target.url, self.token) as response:
            while done < target.size:
                chunk = response.read(min(CHUNK, target.size - done))
                if not chunk:
                    break
                os.pwrite(fd, chunk, done)
                done += len(chunk)
                progress.fetched_bytes(len(chunk))
            if done == target.size and response.read(1):
                raise Refused(f"{target.name}: the server sent more than the listed {done} bytes")
        for number, (start, end) in enumerate(target.pieces()):
            target.record(number, max(0, min(done, end) - start), fd)
        if done < target.size:
            raise ConnectionError(f"{target.name}: the connection ended at byte {done}")

    def finish(self, target: Target, verified: dict[str, str]) -> None:
        """Verify the whole file, then rename it into place and remember it."""
        got = file_hash(target.part, target.kind, target.size)
        if got != target.want:
            target.part.unlink(missing_ok=True)
            target.journal.unlink(missing_ok=True)
            raise Refused(
                f"{target.name}: {target.kind} {got} != expected {target.want}; "
                "removed the download"
            )
        target.part.replace(target.path)
        target.journal.unlink(missing_ok=True)
        with self.verified_lock:
            verified[target.name] = target.want
            replace_with(self.dest / VERIFIED, json.dumps(verified, indent=1, sort_keys=True))

    def run_file(self, target: Target, progress: Progress, verified: dict[str, str]) -> None:
        """Every remaining piece of one file, `streams` at a time across all files."""
        fd = target.open()
        try:
            futures = [
                self.pool.submit(self.fetch_piece, target, n, fd, progress)
                for n in target.remaining()
            ]
            errors = []
            for future in futures:
                try:
                    future.result()
                except NoRanges:
                    target.sequential = True
                except Exception as exc:  # every piece settles before the file's fate is decided
                    errors.append(exc)
            if errors:
                raise errors[0]
            if target.sequential:
                self.fetch_whole(target, fd, progress)
        finally:
            os.close(fd)
        if self.stop.is_set():
            return
        self.finish(target, verified)

    def run(self) -> int:
        files = listing(self.args.endpoint, self.args.repo, self.args.revision, self.token)
        if not isinstance(files, list):
            files = [files]  # named as a bad entry below, before anything is written
        problems = listing_problems(self.dest, files)
        if problems:
            for problem in problems:
                print(f"refused: {problem}", file=sys.stderr)
            print(
                f"the listing from {self.args.endpoint} was not followed; nothing was written",
                file=sys.stderr,
            )
            return 3
        self.dest.mkdir(parents=True, exist_ok=True)
        lock = self._hold_destination()
        try:
            return self._sync(files)
        finally:
            os.close(lock)

    def _hold_destination(self) -> int:
        path = self.dest / LOCK
        drop_link(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise BusyError(
                    f"another sync is writing {self.dest}: wait for it (or stop it) and run "
                    "this again; nothing was changed"
                ) from exc
            raise
        return fd

    def _sync(self, files: list[dict[str, Any]]) -> int:
        verified_file = self.dest / VERIFIED
        drop_link(verified_file)
        try:
            verified = json.loads(verified_file.read_text()) if verified_file.exists() else {}
        except ValueError:
            verified = {}
        if not isinstance(verified, dict):
            verified = {}  # files are checked again rather than trusted
        progress = Progress(sum(entry_size(f) for f in files))
        targets = []
        for entry in files:
            name, size = entry["rfilename"], entry_size(entry)
            kind, want = expected_hash(entry)
            path = self.dest / name
            drop_link(path)  # a finished file that is a link is not the file
            if verified.get(name) == want and path.is_file() and path.stat().st_size == size:
                progress.present(size)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            quoted = urllib.parse.quote(name)
            url = f"{self.args.endpoint}/{self.args.repo}/resolve/{self.args.revision}/{quoted}"
            target = Target(name, url, size, kind, want, path, self.piece)
            target.load()
            progress.present(sum(target.offsets.values()))
            targets.append(target)
        streams = max(1, self.args.streams)
        # Pieces run on `pool`; files are coordinated by `files` (their waits hold no stream).
        with ThreadPoolExecutor(streams) as self.pool, ThreadPoolExecutor(streams) as files_pool:
            jobs = [files_pool.submit(self.run_file, t, progress, verified) for t in targets]
            finished, _ = wait(jobs, return_when=FIRST_EXCEPTION)
            failed = [job.exception() for job in finished if job.exception()]
            if failed:
                self.stop.set()
                wait(jobs)
                raise failed[0]  # type: ignore[misc]
        marker = {
            "repo": self.args.repo,
            "revision": self.args.revision,
            "files": len(files),
            "bytes": progress.total,
            "completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        replace_with(self.dest / MARKER, json.dumps(marker, indent=1))
        emit({"event": "result", "stage": "sync-model", **marker})
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--endpoint", default=os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    )
    parser.add_argument("--repo", required=True)
    parser.add_argument("--revision", required=True)
    parser.add_argument("--dest", required=True)
    parser.add_argument("--streams", type=int, default=DEFAULT_STREAMS)
    parser.add_argument("--piece-bytes", type=int, default=PIECE, help=argparse.SUPPRESS)
    parser.add_argument("--record-every", type=int, default=RECORD_EVERY, help=argparse.SUPPRESS)
    args = parser.parse_args()
    token = sys.stdin.readline().strip() if not sys.stdin.isatty() else ""
    try:
        return Sync(args, token).run()
    except Refused as exc:
        print(f"{exc}", file=sys.stderr)
        return 3
    except BusyError as exc:
        print(f"{exc}", file=sys.stderr)
        return 5
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            print(
                f"the hub refused the token ({exc.code}): set HF_TOKEN to a token with access",
                file=sys.stderr,
            )
            return 2
        if exc.code == 404:
            print(f"{args.repo}@{args.revision} not found on {args.endpoint}", file=sys.stderr)
            return 2
        print(f"HTTP {exc.code} from {exc.url}; run again to resume", file=sys.stderr)
        return 4
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        print(f"network error: {exc}; run again to resume", file=sys.stderr)
        return 4


if __name__ == "__main__":
    sys.exit(main())
