"""The three ways vLLM 0.32 reads safetensors weights, timed side by side on this machine's disk and
device without vLLM: the reader comparison of bench/start_up.py where no vLLM is installed (a GPU
machine with torch and safetensors only; scripts/gpu-smoke step 4).

Run: python bench/weight_readers.py [--gb G] [--threads N] [--where DIR] [--device cuda|cpu]

A checkpoint of about G GB of bf16 random tensors in 2 GB shards is written once under --where
(kept: a second run reuses it). Each reader then loads every tensor onto the device, from a cold
page cache (each file's pages dropped with posix_fadvise DONTNEED; this reaches the disk only
where nothing else holds the pages) and from a warm one (every file read first), as vLLM's
weight_utils does for each --safetensors-load-strategy:
  lazy:     safe_open (mmap) per file, each tensor read on first touch and copied to the device;
  prefetch: N threads read the files into the page cache first, then the lazy path;
  eager:    each file read whole into memory, parsed from bytes, then copied.
The floor for a cold read is the disk's sequential bandwidth (printed first, from one `dd`-like
read of the first shard); a warm read's floor is the host-to-device copy. Ratios are to the
first row.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

SHARD_BYTES = 2_000_000_000
TENSOR_ELEMENTS = 4096 * 7168  # one expert-sized bf16 matrix, ~59 MB


def write_checkpoint(where: Path, gb: float) -> list[Path]:
    import torch
    from safetensors.torch import save_file

    folder = where / f"readers-{gb:g}gb"
    marker = folder / "complete"
    if marker.is_file():
        return sorted(folder.glob("*.safetensors"))
    folder.mkdir(parents=True, exist_ok=True)
    total, shard, shard_bytes, index = int(gb * 1e9), {}, 0, 0
    written = 0
    generator = torch.Generator().manual_seed(0)
    while written < total:
        tensor = torch.randn(TENSOR_ELEMENTS, generator=generator).to(torch.bfloat16)
        shard[f"layer.{written // (TENSOR_ELEMENTS * 2)}.weight"] = tensor
        shard_bytes += TENSOR_ELEMENTS * 2
        written += TENSOR_ELEMENTS * 2
        if shard_bytes >= SHARD_BYTES or written >= total:
            save_file(shard, str(folder / f"model-{index:05d}.safetensors"))
            shard, shard_bytes, index = {}, 0, index + 1
    marker.write_text("")
    return sorted(folder.glob("*.safetensors"))


def drop(files: list[Path]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_through(path: Path) -> int:
    read = 0
    with path.open("rb", buffering=0) as handle:
        while chunk := handle.read(16 << 20):
            read += len(chunk)
    return read


def warm(files: list[Path]) -> None:
    for path in files:
        read_through(path)


def lazy(files: list[Path], device: str) -> int:
    from safetensors import safe_open

    moved = 0
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                moved += handle.get_tensor(name).to(device, copy=True).numel()
    return moved


def prefetch(files: list[Path], device: str, threads: int) -> int:
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(read_through, files))
    return lazy(files, device)


def eager(files: list[Path], device: str) -> int:
    from safetensors.torch import load

    moved = 0
    for path in files:
        for tensor in load(path.read_bytes()).values():
            moved += tensor.to(device, copy=True).numel()
    return moved


def timed(run: Callable[[], Any], device: str) -> float:
    import torch

    began = time.perf_counter()
    run()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - began


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/weight_readers.py")
    parser.add_argument("--gb", type=float, default=4.0)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--where", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None)
    parsed = parser.parse_args(argv)
    import torch

    device = parsed.device or ("cuda" if torch.cuda.is_available() else "cpu")
    files = write_checkpoint(parsed.where, parsed.gb)
    size = sum(p.stat().st_size for p in files)
    drop(files[:1])
    floor_s = timed(lambda: read_through(files[0]), "cpu")
    disk = files[0].stat().st_size / floor_s / 1e9
    print(f"checkpoint {size / 1e9:.1f} GB in {len(files)} files under {files[0].parent}")
    print(f"device {device}; one cold sequential read of a shard: {disk:.2f} GB/s")
    readers: dict[str, Callable[[], int]] = {
        "lazy": lambda: lazy(files, device),
        "prefetch": lambda: prefetch(files, device, parsed.threads),
        "eager": lambda: eager(files, device),
    }
    print(f"{'reader':9} {'cache':5} {'seconds':>8} {'GB/s':>6} {'x first':>8}")
    first = None
    for name, reader in readers.items():
        for cache in ("cold", "warm"):
            (drop if cache == "cold" else warm)(files)
            seconds = timed(reader, device)
            first = first or seconds
            print(
                f"{name:9} {cache:5} {seconds:8.1f} {size / seconds / 1e9:6.2f} "
                f"{seconds / first:8.2f}"
            )
            if device == "cuda":
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
