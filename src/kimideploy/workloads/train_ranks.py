"""The ranks of one training run and what they do together: join the process group, measure the
network before the first step, stop at the same step, wait for each other, and pool the held-out
judgement. One process (RANK unset) is a world of one and every collective is a no-op.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kimideploy.config.specs import NetworkCheck, TrainSpec
from kimideploy.workloads import allreduce_probe
from kimideploy.workloads.runtime import BadInputError, Stopper, emit, log

# PyTorch's own default for NCCL: long enough for a checkpoint write on rank 0, short enough
# that a hung rank does not hold a whole cluster for an hour.
COLLECTIVE_TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True)
class Ranks:
    rank: int
    world: int
    local_rank: int

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_environment(cls) -> Ranks:
        """What the launcher (or torchrun) set (a single process without it)."""
        return cls(
            int(os.environ.get("RANK", "0")),
            int(os.environ.get("WORLD_SIZE", "1")),
            int(os.environ.get("LOCAL_RANK", "0")),
        )


def join_timeout(spec: TrainSpec) -> timedelta:
    """Online, each rank joins only once its node's server has loaded, and nodes load at different
    speeds: joining may take up to the servers' budget."""
    return COLLECTIVE_TIMEOUT + (
        timedelta(seconds=spec.online.server_wait_s) if spec.online else timedelta()
    )


class Collectives:
    """The process group of the run's ranks, on this rank's device."""

    def __init__(self, spec: TrainSpec, ranks: Ranks) -> None:
        import torch

        self.ranks = ranks
        self.group: Any = None
        self.device = (
            torch.device("cuda", ranks.local_rank)
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
        if ranks.world == 1:
            return
        import torch.distributed as dist

        if torch.cuda.is_available():
            torch.cuda.set_device(self.device)
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        join = join_timeout(spec)
        dist.init_process_group(backend, timeout=join)
        # Online, a rank whose server dropped waits for it to reload (up to its budget) before
        # its next collective; the others wait for it rather than time out.
        self.group = dist.new_group(backend=backend, timeout=join)
        if spec.network_check is not None:
            self.check_network(spec.network_check)

    def check_network(self, check: NetworkCheck) -> None:
        """An all-reduce across every rank before the first step: its bus bandwidth and the
        transport NCCL took on each rank; sockets or too little bandwidth stop the run here,
        named, instead of training for days over one TCP stream per rank."""
        import torch.distributed as dist

        seconds, size = allreduce_probe.measure(self.group, self.device, check.bytes, 5)
        own = allreduce_probe.bus_bandwidth_gbps(size, seconds, self.ranks.world)
        # Every rank's transport and figure: the slowest rank's figure decides on every rank, so
        # all of them stop here or none does (a rank that went on would wait at its first step).
        seen: list[tuple[str | None, float] | None] = [None] * self.ranks.world
        dist.all_gather_object(seen, (allreduce_probe.own_transport(), own), group=self.group)
        transports = [one[0] if one else None for one in seen]
        bus = min(one[1] for one in seen if one)
        if self.ranks.leader:
            emit(
                {
                    "event": "network",
                    "stage": "train",
                    "ranks": self.ranks.world,
                    "bus_gbps": round(bus, 2),
                    "transports": transports,
                }
            )
        problem = allreduce_probe.verdict(transports, bus, check.min_bus_gbps)
        if problem is not None:
            self.close()  # every rank reached the same verdict; exit 2 must not end in an abort
            raise BadInputError(problem)
        log(f"all-reduce across {self.ranks.world} ranks: {bus:.1f} GB/s bus bandwidth")

    def wrap(self, model: Any) -> Any:
        """The model as the steps call it: data-parallel across the ranks, itself alone."""
        if self.ranks.world == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, process_group=self.group)

    def should_stop(self, stopper: Stopper) -> bool:
        """Every rank stops at the same step: a SIGTERM on any of them stops all."""
        if self.ranks.world == 1:
            return stopper.stopping
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1.0 if stopper.stopping else 0.0], device=self.device)
        dist.all_reduce(flag, group=self.group)
        return bool(flag.item() > 0)

    def all_finite(self, *values: float) -> bool:
        """Whether every rank's values are finite: a step is taken or skipped by all of them, or
        the ranks' weights part."""
        finite = all(math.isfinite(v) for v in values)
        if self.ranks.world == 1:
            return finite
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1.0 if finite else 0.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item() > 0)

    def barrier(self) -> None:
        if self.ranks.world > 1:
            import torch.distributed as dist

            dist.barrier(group=self.group)

    def close(self) -> None:
        """Destroy the process groups, on every rank, once all of them are past their last
        collective. A process that exits with its groups alive leaves gloo's worker threads
        holding tensors while the interpreter finalizes: the process aborts (SIGABRT, "terminate
        called without an active exception") after its work is done, seen on a loaded machine,
        and NCCL warns that pending operations may not have finished (PyTorch's shutdown
        documentation: call destroy_process_group near the end of main)."""
        if self.ranks.world > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()

    def gather_turns(self, mine: list[list[int]]) -> list[list[int]]:
        """Every rank's judged turns, in rank order: the interval resamples turns, so the counts
        of each turn travel, not only their sums."""
        if self.ranks.world == 1:
            return mine
        import torch.distributed as dist

        gathered: list[list[list[int]] | None] = [None] * self.ranks.world
        dist.all_gather_object(gathered, mine, group=self.group)
        return [turn for part in gathered for turn in (part or [])]
