"""A checkpoint's files read at the storage's pace, from a pod: three uses of one reader.

- `warm DIR`: read every file into the page cache (the pages stay cached after the pod ends,
  charged to the node, not to the serve pod: plan/page_cache.py says when this runs);
- `probe DIR --sample-gb G`: drop each sampled file's cached pages first (posix_fadvise
  DONTNEED), then read them: the storage's cold read bandwidth (the storage probe);
- `copy DIR --to LOCAL`: copy the folder to node-local NVMe, file by file through a partial name
  renamed when whole, skipping files already there with the same size, the completion marker
  last (resumable: a copy cut off goes on where it stopped).

Every file is read in READ_BLOCK chunks by `--threads` readers at once (one file each); progress
is one JSON line per second on stdout, the result the last line: bytes, seconds, GB/s. Exit 0
done, 2 bad input (no such folder, nothing to read), 1 a read or write that failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

READ_BLOCK = 16 * 2**20
MARKER = ".kimideploy-complete"
"""What the downloader writes last; the copy writes it last too."""
PARTIAL = ".kimideploy-partial"


class Meter:
    """Bytes read so far, told once a second."""

    def __init__(self, stage: str, total: int) -> None:
        self.stage, self.total = stage, total
        self.done = 0
        self.began = time.monotonic()
        self.told = self.began
        self.lock = threading.Lock()

    def add(self, count: int) -> None:
        with self.lock:
            self.done += count
            now = time.monotonic()
            if now - self.told >= 1.0:
                self.told = now
                _event(
                    "progress",
                    stage=self.stage,
                    done=self.done,
                    total=self.total,
                    unit="bytes",
                    rate=round(self.done / max(now - self.began, 1e-9)),
                )

    def result(self, **extra: object) -> None:
        seconds = max(time.monotonic() - self.began, 1e-9)
        _event(
            "result",
            stage=self.stage,
            bytes=self.done,
            seconds=round(seconds, 2),
            gbps=round(self.done / seconds / 1e9, 3),
            **extra,
        )


def _event(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def files_of(folder: Path) -> list[Path]:
    """Every regular file under `folder` (links are not followed), largest first: the long reads
    start first, so the readers finish together."""
    found = [
        p for p in folder.rglob("*") if p.is_file() and not p.is_symlink() and p.name != MARKER
    ]
    return sorted(found, key=lambda p: p.stat().st_size, reverse=True)


def _read(path: Path, meter: Meter, drop_first: bool) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        if drop_first:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        while True:
            chunk = os.read(fd, READ_BLOCK)
            if not chunk:
                return
            meter.add(len(chunk))
    finally:
        os.close(fd)


def read_all(paths: list[Path], threads: int, meter: Meter, drop_first: bool) -> None:
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for future in [pool.submit(_read, p, meter, drop_first) for p in paths]:
            future.result()


def sample(paths: list[Path], sample_bytes: int) -> list[Path]:
    """Files adding up to about `sample_bytes` (at least one)."""
    chosen: list[Path] = []
    total = 0
    for path in sorted(paths, key=lambda p: p.name):
        if chosen and total >= sample_bytes:
            break
        chosen.append(path)
        total += path.stat().st_size
    return chosen


def _copy_one(source: Path, folder: Path, to: Path, meter: Meter) -> None:
    target = to / source.relative_to(folder)
    size = source.stat().st_size
    if target.is_file() and not target.is_symlink() and target.stat().st_size == size:
        meter.add(size)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}{PARTIAL}")
    with source.open("rb") as reader, partial.open("wb") as writer:
        while chunk := reader.read(READ_BLOCK):
            writer.write(chunk)
            meter.add(len(chunk))
        writer.flush()
        os.fsync(writer.fileno())
    partial.replace(target)


def copy_folder(folder: Path, to: Path, threads: int) -> Meter:
    """The folder's files into `to`, then its marker (last: a reader trusts only a whole copy)."""
    paths = files_of(folder)
    meter = Meter("copy", sum(p.stat().st_size for p in paths))
    (to / MARKER).unlink(missing_ok=True)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for future in [pool.submit(_copy_one, p, folder, to, meter) for p in paths]:
            future.result()
    (to / MARKER).write_text("copied\n")
    return meter


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kimideploy.workloads.page_cache")
    parser.add_argument("mode", choices=("warm", "probe", "copy"))
    parser.add_argument("dir", type=Path)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--sample-gb", type=float, default=20.0)
    parser.add_argument("--to", type=Path, help="copy: the node-local folder")
    args = parser.parse_args(argv)
    folder: Path = args.dir
    if not folder.is_dir():
        print(f"page-cache: {folder} is not a folder", file=sys.stderr)
        return 2
    paths = files_of(folder)
    if not paths:
        print(f"page-cache: {folder} holds no file to read", file=sys.stderr)
        return 2
    try:
        if args.mode == "copy":
            if args.to is None:
                print("page-cache: copy needs --to", file=sys.stderr)
                return 2
            copy_folder(folder, args.to, args.threads).result(to=str(args.to))
            return 0
        chosen = sample(paths, int(args.sample_gb * 1e9)) if args.mode == "probe" else paths
        meter = Meter(args.mode, sum(p.stat().st_size for p in chosen))
        read_all(chosen, args.threads, meter, drop_first=args.mode == "probe")
        meter.result(files=len(chosen), cold=args.mode == "probe")
    except OSError as exc:
        print(f"page-cache: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
