"""A seconds-long all-reduce across GPUs (and nodes), with its bus bandwidth and the transport NCCL
chose: the first collective a training or serving run makes, run before the run so that a hang,
a missing device or TCP sockets instead of InfiniBand show up in seconds with the cause named.

Two ways in:
- `local(gpus, ...)`: one process per GPU of this pod, started here and waited for with a hard
  timeout (the GPU check in every serve pod's init container, `host check`'s probe);
- `python -m kimideploy.workloads.allreduce_probe` under torchrun (RANK, WORLD_SIZE, LOCAL_RANK,
  MASTER_ADDR set): one rank of a multi-node probe (the trainer pods' preflight).

Bus bandwidth is NCCL-tests' figure: algorithm bandwidth (bytes / time) x 2 (n - 1) / n, which
is comparable across rank counts. The transport is read from NCCL's own INFO log (NCCL_DEBUG=INFO
with NCCL_DEBUG_FILE per process): "Using network IB" or "Using network Socket"; a probe whose
ranks span nodes and that NCCL ran over sockets is a failure whatever its bandwidth.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DEFAULT_BYTES = 256 * 2**20
DEFAULT_ITERATIONS = 10
NETWORK_LINE = re.compile(r"Using network (\w+)")


@dataclass(frozen=True)
class ProbeResult:
    ranks: int
    bytes: int
    seconds: float
    """Mean time of one all-reduce, after one warm-up."""
    bus_gbps: float
    transport: str | None
    """The network plugin NCCL chose ("IB", "Socket"); None within a node (P2P/NVLink/SHM)."""
    backend: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def bus_bandwidth_gbps(size: int, seconds: float, ranks: int) -> float:
    """NCCL-tests' bus bandwidth of an all-reduce of `size` bytes in `seconds` over `ranks`."""
    if seconds <= 0 or ranks < 1:
        return 0.0
    factor = 2 * (ranks - 1) / ranks if ranks > 1 else 1.0
    return size / seconds * factor / 1e9


def transport_from_logs(texts: list[str]) -> str | None:
    """The network NCCL used, from its INFO logs; Socket wins if any rank fell back to it."""
    found = {m.group(1) for text in texts for m in NETWORK_LINE.finditer(text)}
    if "Socket" in found:
        return "Socket"
    return sorted(found)[0] if found else None


def measure(group: Any, device: Any, size: int, iterations: int) -> tuple[float, int]:
    """(seconds per all-reduce, bytes) of `size` bytes over `group`, after one warm-up, the sum
    checked."""
    import torch
    import torch.distributed as dist

    cuda = device.type == "cuda"
    elements = max(size // 4, 1)
    tensor = torch.ones(elements, dtype=torch.float32, device=device)
    dist.all_reduce(tensor, group=group)  # warm-up: connections are set up on the first call
    if cuda:
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    for _ in range(iterations):
        tensor.fill_(1.0)
        dist.all_reduce(tensor, group=group)
    if cuda:
        torch.cuda.synchronize(device)
    seconds = (time.perf_counter() - started) / iterations
    world = dist.get_world_size(group)
    value = float(tensor[0].item())
    if value != float(world):
        raise RuntimeError(f"all-reduce of ones over {world} ranks gave {value}")
    return seconds, elements * 4


def one_rank(
    *,
    rank: int,
    world: int,
    local_rank: int,
    size: int,
    iterations: int,
    backend: str,
    init_method: str | None = None,
) -> ProbeResult:
    """Join the group, all-reduce `size` bytes `iterations` times after a warm-up, check the sum."""
    import torch
    import torch.distributed as dist

    cuda = backend == "nccl"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend, init_method=init_method or "env://", rank=rank, world_size=world
    )
    try:
        seconds, reduced = measure(None, device, size, iterations)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    bus = bus_bandwidth_gbps(reduced, seconds, world)
    return ProbeResult(world, reduced, seconds, round(bus, 2), None, backend)


def own_transport() -> str | None:
    """The network this process's NCCL chose, from its own INFO log (NCCL_DEBUG_FILE, where %h is
    the host name and %p the process id), or None without one."""
    pattern = os.environ.get("NCCL_DEBUG_FILE")
    if not pattern:
        return None
    path = Path(pattern.replace("%h", socket.gethostname()).replace("%p", str(os.getpid())))
    try:
        return transport_from_logs([path.read_text(errors="replace")])
    except OSError:
        return None


def verdict(
    transports: list[str | None], bus_gbps: float, min_bus_gbps: float | None
) -> str | None:
    """Why an all-reduce across nodes is not good enough to train over, or None."""
    if "Socket" in transports:
        ranks = [str(i) for i, t in enumerate(transports) if t == "Socket"]
        return (
            f"NCCL all-reduced over TCP sockets, not InfiniBand (rank {', '.join(ranks)}): the pod "
            "sees no RDMA device. Set clusters.<c>.network: rdma_resource (the RDMA device "
            "plugin's resource), host_network or network_attachments, and ib_hcas"
        )
    if min_bus_gbps is not None and bus_gbps < min_bus_gbps:
        taken = ", ".join(sorted({t for t in transports if t})) or "unknown"
        return (
            f"the all-reduce across the nodes reached {bus_gbps:.1f} GB/s bus bandwidth, below "
            f"network.min_bus_gbps {min_bus_gbps:g} (transport {taken}): check network.ib_hcas "
            "names the compute HCAs and every port is ACTIVE (`kimideploy host check`)"
        )
    return None


class ProbeFailedError(RuntimeError):
    """The probe did not complete: a rank failed, or the timeout passed (a hang)."""


def local(
    gpus: int,
    *,
    timeout_s: float,
    size: int = DEFAULT_BYTES,
    iterations: int = DEFAULT_ITERATIONS,
    backend: str = "nccl",
) -> ProbeResult:
    """One process per GPU of this machine, each a rank of one all-reduce; ProbeFailedError
    naming the rank and its last lines, or the hang, when it does not complete in time."""
    with tempfile.TemporaryDirectory(prefix="kimideploy-allreduce-") as work:
        init = f"file://{work}/rendezvous"
        env = {**os.environ, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": f"{work}/nccl.%h.%p.log"}
        ranks = []
        for rank in range(gpus):
            command = [
                sys.executable,
                "-m",
                "kimideploy.workloads.allreduce_probe",
                "--rank",
                str(rank),
                "--world",
                str(gpus),
                "--local-rank",
                str(rank),
                "--bytes",
                str(size),
                "--iterations",
                str(iterations),
                "--backend",
                backend,
                "--init-method",
                init,
            ]
            ranks.append(
                subprocess.Popen(
                    command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
                )
            )
        deadline = time.monotonic() + timeout_s
        outputs = []
        try:
            for rank, process in enumerate(ranks):
                left = max(deadline - time.monotonic(), 0.1)
                try:
                    out, err = process.communicate(timeout=left)
                except subprocess.TimeoutExpired as exc:
                    raise ProbeFailedError(
                        f"the all-reduce over {gpus} GPUs did not finish within {timeout_s:g} s "
                        f"(rank {rank} still waiting): a hang, as NCCL shows when peer-to-peer "
                        "between the GPUs is blocked (IOMMU, ACS) or a GPU is unreachable"
                    ) from exc
                if process.returncode != 0:
                    tail = " | ".join(err.strip().splitlines()[-3:])
                    raise ProbeFailedError(f"rank {rank} of the all-reduce failed: {tail}")
                outputs.append(out)
        finally:
            for process in ranks:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        logs = [p.read_text(errors="replace") for p in Path(work).glob("nccl.*.log")]
    result = ProbeResult(**json.loads(outputs[0].strip().splitlines()[-1]))
    return ProbeResult(
        result.ranks,
        result.bytes,
        result.seconds,
        result.bus_gbps,
        transport_from_logs(logs),
        backend,
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kimideploy.workloads.allreduce_probe")
    parser.add_argument("--rank", type=int, default=int(os.environ.get("RANK", "0")))
    parser.add_argument("--world", type=int, default=int(os.environ.get("WORLD_SIZE", "1")))
    parser.add_argument("--local-rank", type=int, default=int(os.environ.get("LOCAL_RANK", "0")))
    parser.add_argument("--bytes", type=int, default=DEFAULT_BYTES)
    parser.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS)
    parser.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    parser.add_argument("--init-method", default=None)
    args = parser.parse_args(argv)
    result = one_rank(
        rank=args.rank,
        world=args.world,
        local_rank=args.local_rank,
        size=args.bytes,
        iterations=args.iterations,
        backend=args.backend,
        init_method=args.init_method,
    )
    print(json.dumps(result.as_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
