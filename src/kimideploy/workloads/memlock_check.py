"""Can this process lock the memory NCCL registers with the InfiniBand HCAs? Checked in the
trainer pod's first seconds, before its target server loads (~25 minutes of GPUs).

NCCL over InfiniBand pins host and GPU buffers (ibv_reg_mr) and fails its transport setup against
a low RLIMIT_MEMLOCK (container runtimes default to 8 MiB or 64 KiB). The pod's
`capabilities.add: [IPC_LOCK]` would lift the limit, but it is not effective for a non-root
process: Kubernetes and containerd set no ambient capabilities (kubernetes/enhancements#2757),
and file capabilities do nothing under allowPrivilegeEscalation: false (no_new_privs). A raised
limit can only come from the node: the container runtime's LimitMEMLOCK, which every container
inherits. So this checks what the process will really have: the soft limit, the hard limit and
whether CAP_IPC_LOCK is in its effective set; exit 0 when NCCL can pin, 2 (bad input: the node,
not the run, must change; the gang fails at once) with the node's fix otherwise.
"""

from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path

CAP_IPC_LOCK = 14
UNLIMITED = resource.RLIM_INFINITY
NODE_FIX = (
    "set LimitMEMLOCK=infinity for the node's container runtime (a systemd drop-in for "
    "k3s.service or containerd.service, then restart it; running containers keep theirs) and "
    "start the run again: `kimideploy host provision` does it, `kimideploy host check` reads it"
)


def effective_capabilities(status: str) -> int:
    """CapEff from /proc/self/status (a hex bit mask)."""
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def verdict(soft: int, hard: int, capabilities: int, min_bytes: int | None) -> tuple[bool, str]:
    """(can pin, what was found)."""
    shown = "unlimited" if soft == UNLIMITED else f"{soft / 2**20:g} MiB"
    hard_shown = "unlimited" if hard == UNLIMITED else f"{hard / 2**20:g} MiB"
    can_lock = bool(capabilities >> CAP_IPC_LOCK & 1)
    found = f"RLIMIT_MEMLOCK soft {shown}, hard {hard_shown}; CAP_IPC_LOCK " + (
        "effective" if can_lock else "not effective"
    )
    enough = soft == UNLIMITED or (min_bytes is not None and soft >= min_bytes)
    return enough or can_lock, found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kimideploy.workloads.memlock_check")
    parser.add_argument(
        "--min-mib",
        type=float,
        default=None,
        help="Accept a finite soft limit of at least this many MiB (default: only unlimited).",
    )
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    capabilities = effective_capabilities(Path("/proc/self/status").read_text())
    min_bytes = int(args.min_mib * 2**20) if args.min_mib is not None else None
    ok, found = verdict(soft, hard, capabilities, min_bytes)
    if ok:
        print(f"memlock-check: ok: {found}", file=sys.stderr)
        return 0
    print(
        f"memlock-check: NCCL cannot pin its InfiniBand buffers: {found} (capabilities.add "
        "IPC_LOCK does not reach a non-root process); the node must provide it: " + NODE_FIX,
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
