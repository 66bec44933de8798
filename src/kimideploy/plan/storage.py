"""Storage estimates: the size of the hidden-state volume (828 GB for 10K samples last time)."""

from __future__ import annotations

import math

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
GIB = 2**30


def hidden_state_bytes_per_token(aux_layers: int, hidden_size: int, dtype: str) -> int:
    """Stored bytes per token: each aux layer plus the final layer, one hidden vector each."""
    return (aux_layers + 1) * hidden_size * DTYPE_BYTES[dtype]


def hidden_state_bytes(samples: int, tokens_per_sample: int, bytes_per_token: int) -> int:
    return samples * tokens_per_sample * bytes_per_token


def claim_size_gib(estimate_bytes: int, headroom: float) -> int:
    """Whole GiB with headroom, never below 1."""
    return max(1, math.ceil(estimate_bytes * (1 + headroom) / GIB))


def human_bytes(count: float) -> str:
    """Decimal units, as disk vendors and the team's notes (828 GB) use them."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(count) < 1000 or unit == "PB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")
