"""The training launcher: one process per GPU with the variables torch.distributed reads, and the
workers' exit code passed to the Job, which torchrun does not do.

torchrun's elastic agent raises ChildFailedError whenever a worker exits non-zero, so the
container exits 1 whatever the worker returned: a rank that drained on SIGTERM and wrote its
checkpoint (75, RESUMABLE) or refused its input (2, BAD_INPUT) looks to the Job like a failure,
and the train Job's podFailurePolicy rules for 75 and 2 never match (a drained multi-node run
fails whole instead of resuming). The Job already knows everything a rendezvous would find out
(the node's rank is its completion index, the world is nodes x GPUs, rank 0's pod has a stable
name through the headless Service), so this launcher sets RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and MASTER_PORT itself and starts the workers.

The exit code, from the first worker that ended without success (the cause; the others usually
fail after it at their next collective, or were stopped here):
- 0 when every worker succeeded;
- 75 when the launcher was asked to stop (SIGTERM, SIGINT: forwarded to every worker, which
  checkpoints and exits 75) or the first failure was a 75: every index starts again and resumes;
- that worker's code otherwise (2: bad input, the index fails at once; 1: a failure), or 1 for a
  worker killed by a signal.
Once one worker has failed, the others get GRACE_S to end on their own, then SIGTERM, then
SIGKILL after another GRACE_S, so no rank is left waiting out a collective's timeout.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

RESUMABLE = 75
GRACE_S = 30.0
POLL_S = 0.2


@dataclass
class Worker:
    local_rank: int
    process: subprocess.Popen[bytes]
    ended_at: float | None = None
    stopped: bool = False
    """Sent SIGTERM by the launcher because another worker failed (not a cause)."""


def worker_env(
    base: dict[str, str],
    *,
    local_rank: int,
    nproc: int,
    node_rank: int,
    nnodes: int,
    master_addr: str,
    master_port: int,
) -> dict[str, str]:
    """What torch.distributed's env:// initialisation reads, as torchrun would set it."""
    return {
        **base,
        "RANK": str(node_rank * nproc + local_rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(nproc * nnodes),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": str(node_rank),
        "NODE_RANK": str(node_rank),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }


def exit_code(workers: list[Worker], asked_to_stop: bool) -> int:
    """The launcher's exit code from its workers (see the module docstring)."""
    failed = sorted(
        (w for w in workers if w.process.returncode not in (0, None) and not w.stopped),
        key=lambda w: w.ended_at or 0.0,
    )
    if asked_to_stop:
        drained = all(w.process.returncode in (0, RESUMABLE) for w in workers)
        return RESUMABLE if drained or not failed else _code(failed[0])
    if not failed:
        return 0 if all(w.process.returncode == 0 for w in workers) else 1
    return _code(failed[0])


def _code(worker: Worker) -> int:
    code = worker.process.returncode
    return code if code is not None and code > 0 else 1


class Launcher:
    def __init__(
        self, commands: list[list[str]], envs: list[dict[str, str]], grace_s: float = GRACE_S
    ) -> None:
        self.commands, self.envs, self.grace_s = commands, envs, grace_s
        self.workers: list[Worker] = []
        self.asked_to_stop = False

    def _signal_all(self, sig: signal.Signals, *, marking: bool = False) -> None:
        for worker in self.workers:
            if worker.process.poll() is None:
                if marking:
                    worker.stopped = True
                worker.process.send_signal(sig)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.asked_to_stop = True
        self._signal_all(signal.Signals(signum))

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        for local_rank, (command, env) in enumerate(zip(self.commands, self.envs, strict=True)):
            process = subprocess.Popen(command, env=env)
            self.workers.append(Worker(local_rank, process))
        first_failure: float | None = None
        terminated_at: float | None = None
        while True:
            now = time.monotonic()
            for worker in self.workers:
                if worker.ended_at is None and worker.process.poll() is not None:
                    worker.ended_at = now
                    if worker.process.returncode != 0 and first_failure is None:
                        first_failure = now
            if all(w.ended_at is not None for w in self.workers):
                return exit_code(self.workers, self.asked_to_stop)
            if (
                first_failure is not None
                and terminated_at is None
                and now - first_failure > GRACE_S
            ):
                self._signal_all(signal.SIGTERM, marking=True)
                terminated_at = now
            if terminated_at is not None and now - terminated_at > self.grace_s:
                self._signal_all(signal.SIGKILL, marking=True)
            time.sleep(POLL_S)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kimideploy.workloads.launch",
        description="Start one process per GPU (the arguments after -- are Python's) and exit "
        "with their code: 0, 75 (resumable), 2 (bad input), or the first failure's.",
    )
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, default=29500)
    parser.add_argument("--grace-s", type=float, default=GRACE_S)
    parser.add_argument("python_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    given: list[str] = args.python_args
    python_args = given[1:] if given[:1] == ["--"] else given
    if not python_args:
        parser.error("name what each worker runs after --, e.g. -- -m kimideploy.workloads train")
    if not 0 <= args.node_rank < args.nnodes:
        parser.error(f"--node-rank {args.node_rank} is not below --nnodes {args.nnodes}")
    base = dict(os.environ)
    envs = [
        worker_env(
            base,
            local_rank=rank,
            nproc=args.nproc_per_node,
            node_rank=args.node_rank,
            nnodes=args.nnodes,
            master_addr=args.master_addr,
            master_port=args.master_port,
        )
        for rank in range(args.nproc_per_node)
    ]
    commands = [[sys.executable, *python_args] for _ in envs]
    return Launcher(commands, envs, args.grace_s).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
