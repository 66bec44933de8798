"""A seconds-long start-up check: the GPUs' architecture and driver suit this image.

Runs as the serve pod's first init container (`python -m kimideploy.workloads.gpucheck`), before a
25-minute weight load: an sm_120 RTX PRO 6000 with an image built only for sm_100/sm_103 (or a
driver too old for the image's CUDA) fails here with the reason, not deep inside vLLM.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from kimideploy.config.images import MIN_DRIVER_FOR_CUDA
from kimideploy.formats.gpuinfo import QUERY_FIELDS, arch_of, parse_query, version_tuple


def problems(rows: list[dict[str, str]], archs: list[str], cuda: str, expected: int) -> list[str]:
    """Everything wrong with these GPUs for this image; empty when ready."""
    found = []
    if len(rows) != expected:
        found.append(f"{len(rows)} GPUs visible, the pod asked for {expected}")
    for arch in sorted({arch_of(r["compute_cap"]) for r in rows} - set(archs)):
        names = sorted({r["name"] for r in rows if arch_of(r["compute_cap"]) == arch})
        found.append(
            f"{', '.join(names)} is {arch}; this image is built for {', '.join(archs)} "
            "(use the cluster's image, or rebuild with this architecture)"
        )
    needed = MIN_DRIVER_FOR_CUDA.get(cuda)
    for driver in sorted({r["driver_version"] for r in rows}):
        if needed and version_tuple(driver) < version_tuple(needed):
            found.append(f"driver {driver} is older than {needed}, the minimum for CUDA {cuda}")
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--archs", required=True, help="Comma-separated, e.g. sm_100,sm_103")
    parser.add_argument("--cuda", required=True, help="The image's CUDA version, e.g. 12.9")
    parser.add_argument("--gpus", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        output = subprocess.run(
            ["nvidia-smi", f"--query-gpu={QUERY_FIELDS}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"gpu-check: nvidia-smi failed: {exc}", file=sys.stderr)
        return 1
    found = problems(parse_query(output), args.archs.split(","), args.cuda, args.gpus)
    for problem in found:
        print(f"gpu-check: {problem}", file=sys.stderr)
    if not found:
        print("gpu-check: GPUs, architecture and driver suit this image", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
