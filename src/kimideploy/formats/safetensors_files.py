"""Reading safetensors files without torch: is a file whole, and what tensors does it declare.

The files come from volumes and copies kimideploy did not write (a downloaded drafter, a dataset
a pod wrote), so they are read as untrusted input: regular files only (a link, to /dev/zero say,
is refused, not followed), a header of at most MAX_HEADER bytes (the safetensors library's own
limit is 100 MB) checked before it is read, and tensors that lie inside the file without
overlapping each other, each the size its dtype and shape say.
"""

from __future__ import annotations

import itertools
import os
import struct
from pathlib import Path
from typing import Any

from kimideploy.formats.bounded_io import UnreadableFileError, open_regular, parse_json_object

DTYPE_SIZES = {
    "BF16": 2,
    "F16": 2,
    "F32": 4,
    "F64": 8,
    "I64": 8,
    "I32": 4,
    "U8": 1,
    "BOOL": 1,
    "I8": 1,
}
MAX_HEADER = 100 * 1024 * 1024
NO_SIZE_LIMIT = 1 << 62


def _header(path: Path) -> tuple[dict[str, Any], int, int]:
    """(header, where the data begins, file size); UnreadableFileError with the reason."""
    fd, size = open_regular(path, NO_SIZE_LIMIT)
    with os.fdopen(fd, "rb") as handle:
        raw = handle.read(8)
        length = _header_length(raw, size, str(path))
        header = parse_json_object(handle.read(length), f"{path}: header")
    return header, 8 + length, size


def _header_length(raw: bytes, size: int, what: str) -> int:
    if len(raw) < 8:
        raise UnreadableFileError(f"{what}: shorter than a safetensors header")
    (length,) = struct.unpack("<Q", raw[:8])
    if length > MAX_HEADER:
        raise UnreadableFileError(
            f"{what}: header claims {length:,} bytes, over the {MAX_HEADER:,}-byte limit"
        )
    if length > size - 8:
        raise UnreadableFileError(f"{what}: header claims {length} bytes, file has {size}")
    return int(length)


def checked_header(data: bytes, what: str) -> tuple[dict[str, Any], int]:
    """The header of a safetensors file held in memory and where its data begins, if the file is
    whole (every tensor inside it, of its size, none overlapping); UnreadableFileError naming
    `what` and the problem otherwise."""
    length = _header_length(data, len(data), what)
    header = parse_json_object(data[8 : 8 + length], f"{what}: header")
    problem = _layout_problem(header, 8 + length, len(data))
    if problem is not None:
        raise UnreadableFileError(f"{what}: {problem}")
    return header, 8 + length


def _layout_problem(header: dict[str, Any], base: int, size: int) -> str | None:
    """Every tensor inside the data, of its dtype's size, none overlapping another, and the
    data ending where the file does."""
    data_bytes = size - base
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, stop = (int(v) for v in info["data_offsets"])
            count = 1
            for dim in info["shape"]:
                count *= int(dim)
            width = DTYPE_SIZES[info["dtype"]]
        except (KeyError, TypeError, ValueError):
            return f"tensor {name} has no usable dtype, shape or data_offsets"
        if not 0 <= start <= stop:
            return f"tensor {name} has the offsets {start}-{stop}"
        if stop > data_bytes:
            return f"truncated: tensor {name} ends at {base + stop}, file has {size} bytes"
        if stop - start != count * width:
            return f"tensor {name} has {stop - start} bytes for shape {info['shape']}"
        spans.append((start, stop, name))
    spans.sort()
    for (_, stop, first), (start, _, second) in itertools.pairwise(spans):
        if start < stop:
            return f"tensors {first} and {second} overlap"
    end = max((stop for _, stop, _ in spans), default=0)
    if end != data_bytes:
        return f"truncated: tensors end at {base + end}, file has {size} bytes"
    return None


def safetensors_problem(path: Path) -> tuple[str | None, int]:
    """None when the header parses and the tensors fill the file exactly; also the token count."""
    try:
        header, base, size = _header(path)
    except UnreadableFileError as exc:
        return str(exc).removeprefix(f"{path}: "), 0
    problem = _layout_problem(header, base, size)
    if problem is not None:
        return problem, 0
    tokens = (header.get("input_ids") or {}).get("shape", [0])[0]
    return None, int(tokens)


def read_headers(folder: Path) -> tuple[dict[str, Any], list[str]]:
    """Tensor name -> {dtype, shape} across the folder's safetensors files; and broken files."""
    tensors: dict[str, Any] = {}
    broken = []
    for path in sorted(folder.glob("*.safetensors")):
        problem, _ = safetensors_problem(path)
        if problem:
            broken.append(f"{path.name}: {problem}")
            continue
        header, _, _ = _header(path)
        tensors.update({k: v for k, v in header.items() if k != "__metadata__"})
    return tensors, broken


INTEGER_FORMATS = {"I64": "q", "I32": "i", "U8": "B", "I8": "b", "BOOL": "?"}


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The header and where the tensor data begins (bounded, link-safe)."""
    header, base, _ = _header(path)
    return header, base


def read_integers(path: Path, name: str) -> list[int]:
    """One integer tensor (token ids, a loss mask), flattened, without torch."""
    header, base, size = _header(path)
    problem = _layout_problem(header, base, size)
    if problem is not None:
        raise UnreadableFileError(f"{path}: {problem}")
    info = header[name]
    code = INTEGER_FORMATS.get(info["dtype"])
    if code is None:
        raise ValueError(f"{path}: tensor {name} is {info['dtype']}, not an integer type")
    start, stop = info["data_offsets"]
    fd, _ = open_regular(path, NO_SIZE_LIMIT)
    with os.fdopen(fd, "rb") as handle:
        handle.seek(base + start)
        raw = handle.read(stop - start)
    count = (stop - start) // DTYPE_SIZES[info["dtype"]]
    return [int(v) for v in struct.unpack(f"<{count}{code}", raw)]
