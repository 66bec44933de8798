"""Reading `nvidia-smi --query-gpu ... --format=csv,noheader`: shared by host checks and pods."""

from __future__ import annotations

import re

QUERY_FIELDS = (
    "index,name,compute_cap,driver_version,memory.total,persistence_mode,ecc.mode.current,"
    "clocks_event_reasons.active"
)


def parse_query(text: str, fields: str = QUERY_FIELDS) -> list[dict[str, str]]:
    """Rows of the CSV output, keyed by the queried field names."""
    names = fields.split(",")
    rows = []
    for line in text.splitlines():
        if line.strip() and not line.startswith("rc="):
            rows.append(dict(zip(names, (c.strip() for c in line.split(",")), strict=False)))
    return rows


def arch_of(compute_cap: str) -> str:
    """'12.0' -> 'sm_120'."""
    return "sm_" + compute_cap.replace(".", "")


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))
