"""Reading files kimideploy did not write itself (a models or data volume, a copied drafter) as
untrusted input: regular files only (a link is refused, not followed), a size limit checked before
anything is read into memory, and JSON that must be the object the caller expects. Every problem
is an UnreadableFileError naming the file and what is wrong, never a traceback.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
JSON_LIMIT = 16 * MIB
"""A config.json, lineage, manifest or fingerprint is kilobytes; 16 MiB leaves room for big
vocab listings while keeping a planted multi-GB file out of memory."""


CHUNK_LIMIT = 1024 * MIB
"""A conversation chunk (JSON Lines of generated samples) is tens of MB at most; a link to
/dev/zero or a huge planted file is not read into memory."""


class UnreadableFileError(ValueError):
    """A file that is not what it should be: its message names the file and the problem."""


def open_regular(path: Path, limit: int, *, dir_fd: int | None = None) -> tuple[int, int]:
    """An fd for `path` opened without following a final symlink, and its size; refuses links,
    devices, FIFOs (opened non-blocking, so a FIFO never waits for a writer) and files over
    `limit` bytes. With `dir_fd`, `path` is a name inside that open folder: a folder renamed or
    replaced by a link meanwhile cannot redirect the read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (dir_fd is None and path.is_symlink()):
            raise UnreadableFileError(f"{path}: is a symbolic link; refusing to follow it") from exc
        raise UnreadableFileError(f"{path}: cannot be opened ({exc.strerror or exc})") from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UnreadableFileError(f"{path}: not a regular file")
    if info.st_size > limit:
        os.close(fd)
        raise UnreadableFileError(f"{path}: {info.st_size:,} bytes, over the {limit:,}-byte limit")
    return fd, info.st_size


def read_bytes(path: Path, limit: int, *, dir_fd: int | None = None) -> bytes:
    """The whole file, if it is a regular file of at most `limit` bytes (also checked while
    reading, in case it grows)."""
    fd, _ = open_regular(path, limit, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise UnreadableFileError(f"{path}: grew past the {limit:,}-byte limit while being read")
    return data


def open_folder(path: Path) -> int:
    """An fd for the folder `path`, refusing a path through any symbolic link (the folder itself
    or a parent): what is read through it stays inside the folder that was asked for."""
    if os.path.realpath(path) != os.path.abspath(path):  # noqa: PTH100 (normalised, not resolved)
        raise UnreadableFileError(
            f"{path}: reached through a symbolic link ({os.path.realpath(path)}); name the "
            "folder itself"
        )
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise UnreadableFileError(f"{path}: not a readable folder ({exc.strerror or exc})") from exc


def read_json_object(path: Path, limit: int = JSON_LIMIT) -> dict[str, Any]:
    """A JSON object from a bounded regular file."""
    return parse_json_object(read_bytes(path, limit), str(path))


def parse_json_object(data: bytes, what: str) -> dict[str, Any]:
    """`data` as a JSON object; anything else (broken, nested past the parser's depth, a list)
    is named as a problem of `what`."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise UnreadableFileError(f"{what}: not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise UnreadableFileError(f"{what}: a JSON {type(value).__name__}, not an object")
    return value


LINE_LIMIT = 64 * MIB
"""One generated sample is kilobytes to a few MB; a longer line is corrupt (a chunk of one
multi-gigabyte line is never held in memory whole)."""


def json_lines(path: Path, limit: int, line_limit: int = LINE_LIMIT) -> Iterator[JsonLine]:
    """Each line of a bounded regular file, read one at a time: (line number, its JSON value),
    or the problem of that line (not JSON, nested too deeply, longer than `line_limit`) in its
    place. Blank lines are skipped; memory stays within one line."""
    fd, _ = open_regular(path, limit)
    with os.fdopen(fd, "rb") as handle:
        number = 0
        while True:
            raw = handle.readline(line_limit + 1)
            if not raw:
                return
            number += 1
            if len(raw) > line_limit and not raw.endswith(b"\n"):
                while (rest := handle.readline(line_limit)) and not rest.endswith(b"\n"):
                    pass  # the rest of the over-long line, read in bounded pieces
                yield JsonLine(number, None, f"a line over {line_limit:,} bytes")
                continue
            if not raw.strip():
                continue
            try:
                yield JsonLine(number, json.loads(raw), None)
            except (ValueError, RecursionError) as exc:
                yield JsonLine(number, None, f"not a complete JSON line ({str(exc)[:80]})")


@dataclass(frozen=True)
class JsonLine:
    number: int
    value: Any
    problem: str | None
