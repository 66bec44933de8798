"""Reading safetensors files without torch: is a file whole, and what tensors does it declare."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

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


def safetensors_problem(path: Path) -> tuple[str | None, int]:
    """None when the header parses and the tensors fill the file exactly; also the token count."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        raw = handle.read(8)
        if len(raw) < 8:
            return "shorter than a safetensors header", 0
        (length,) = struct.unpack("<Q", raw)
        if length > size - 8:
            return f"header claims {length} bytes, file has {size}", 0
        try:
            header = json.loads(handle.read(length))
        except ValueError:
            return "header is not JSON", 0
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, stop = info["data_offsets"]
        count = 1
        for dim in info["shape"]:
            count *= dim
        if stop - start != count * DTYPE_SIZES.get(info["dtype"], 0):
            return f"tensor {name} has {stop - start} bytes for shape {info['shape']}", 0
        end = max(end, stop)
    if 8 + length + end != size:
        return f"truncated: tensors end at {8 + length + end}, file has {size} bytes", 0
    tokens = header.get("input_ids", {}).get("shape", [0])[0]
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
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        tensors.update({k: v for k, v in header.items() if k != "__metadata__"})
    return tensors, broken


INTEGER_FORMATS = {"I64": "q", "I32": "i", "U8": "B", "I8": "b", "BOOL": "?"}


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The header and where the tensor data begins."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header: dict[str, Any] = json.loads(handle.read(length))
    return header, 8 + length


def read_integers(path: Path, name: str) -> list[int]:
    """One integer tensor (token ids, a loss mask), flattened, without torch."""
    header, base = read_header(path)
    info = header[name]
    code = INTEGER_FORMATS.get(info["dtype"])
    if code is None:
        raise ValueError(f"{path}: tensor {name} is {info['dtype']}, not an integer type")
    start, stop = info["data_offsets"]
    with path.open("rb") as handle:
        handle.seek(base + start)
        raw = handle.read(stop - start)
    count = (stop - start) // DTYPE_SIZES[info["dtype"]]
    return [int(v) for v in struct.unpack(f"<{count}{code}", raw)]
