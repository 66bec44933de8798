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


def capability_of(arch: str) -> tuple[int, int]:
    """'sm_103' -> (10, 3); 'sm_90a', 'compute_120' and 'sm_100f' alike."""
    digits = re.sub(r"[a-z]$", "", arch.split("_", 1)[1])
    return int(digits[:-1]), int(digits[-1])


def sass_covers(compiled: str, device: str) -> bool:
    """Whether machine code built for `compiled` (an `sm_XY` entry of torch's arch flags) runs on
    a `device` architecture. NVIDIA's binary compatibility rule: cubin for X.y runs on X.z with
    z >= y, except the architecture-specific `a` variants (sm_90a, sm_100a), which run on X.y
    alone; PTX (`compute_XY`) is not machine code and does not count here."""
    if not compiled.startswith("sm_"):
        return False
    built, wanted = capability_of(compiled), capability_of(device)
    if compiled.endswith("a"):
        return built == wanted
    return built[0] == wanted[0] and built[1] <= wanted[1]


def uncovered(claimed: list[str], compiled: list[str]) -> list[str]:
    """The claimed architectures no compiled machine code runs on. PTX alone is not enough:
    a library the size of torch JIT-compiled at the first start takes many minutes, and kernels
    built for arch-specific features do not carry over."""
    return [arch for arch in claimed if not any(sass_covers(c, arch) for c in compiled)]
