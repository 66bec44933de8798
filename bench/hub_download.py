"""`host sync-model`'s downloader: one stream against N, side by side in one run.

Run: .venv/bin/python bench/hub_download.py [--mib-per-connection 4] [--files 8] [--mib 8]

A local hub on 127.0.0.1 (tests/integration/hub.py) limits each connection's bandwidth, as hubs,
CDNs and mirrors do per stream; the revision is --files files of --mib MiB. The downloader
(remote/payloads/hub_sync.py, exactly what runs on the host) fetches it with 1, 2, 4 and 8
streams into fresh folders, verifying every file, and the wall time and speedup over one stream
are printed. The speedup approaches N while the link and the disk keep up; on the real host the
per-connection limit is the hub's, not ours.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.integration.hub import Hub

MIB = 1024 * 1024
PAYLOAD = Path(str(resources.files("kimideploy.remote.payloads") / "hub_sync.py"))


def blob(seed: int, size: int) -> bytes:
    block = hashlib.sha256(str(seed).encode()).digest() * (MIB // 32)
    return (block * (size // len(block) + 1))[:size]


def fetch(hub: Hub, dest: Path, streams: int) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(PAYLOAD), "--endpoint", hub.url, "--repo", hub.repo,
         "--revision", hub.revision, "--dest", str(dest), "--streams", str(streams),
         "--piece-bytes", str(2 * MIB)],
        input="token\n", capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"download failed with {streams} streams: {done.stderr}")
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib-per-connection", type=float, default=4.0)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--mib", type=int, default=8)
    args = parser.parse_args()
    files = {f"model-{i:05d}.safetensors": blob(i, args.mib * MIB) for i in range(args.files)}
    hub = Hub("org/model", "b" * 40, files, "token", lfs=set(files))
    hub.per_connection_bytes_per_s = args.mib_per_connection * MIB
    total = args.files * args.mib
    print(f"revision: {args.files} files x {args.mib} MiB = {total} MiB; "
          f"{args.mib_per_connection} MiB/s per connection (127.0.0.1)")  # fmt: skip
    try:
        with tempfile.TemporaryDirectory() as tmp:
            times = {n: fetch(hub, Path(tmp) / f"s{n}", n) for n in (1, 2, 4, 8)}
    finally:
        hub.stop()
    print(f"{'streams':>8} {'seconds':>8} {'MiB/s':>8} {'speedup':>8}")
    for streams, seconds in times.items():
        print(f"{streams:>8} {seconds:>8.2f} {total / seconds:>8.1f} {times[1] / seconds:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
