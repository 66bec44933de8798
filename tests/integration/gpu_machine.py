"""The tools of a GPU machine, for the real sshd: `nvidia-smi`, `lspci`, `systemctl`,
`nvidia-container-runtime` as scripts that print what those tools print on such a machine, and an
InfiniBand sysfs tree. The probe script and the Ansible roles run for real over SSH against them.

The outputs follow the formats of nvidia-smi 580 (`-q`, `-q -d MEMORY`, `topo -m`, `topo -p2p r`,
`--query-gpu`) and lspci 3.x (`-vvv`'s ACSCtl lines); they were written from those formats, not
captured on the hardware (no GPU machine is reachable from here). The sshd passes PATH and
KIMIDEPLOY_SYSFS to every session (SetEnv), so the tools shadow the real ones for these tests only.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

BUS_IDS = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0",
           "00000000:9A:00.0", "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0"]  # fmt: skip


@dataclass
class Machine:
    name: str = "NVIDIA B300 SXM6 AC"
    compute_cap: str = "10.3"
    driver: str = "580.95.05"
    memory_mib: int = 275040
    bar1_mib: int = 524288
    fabric: list[tuple[str, str]] = field(default_factory=lambda: [("Completed", "Success")] * 8)
    link: str = "NV18"
    """Every GPU pair's `topo -m` word."""
    acs_redirecting: bool = False
    ib_ports: dict[str, tuple[str, str]] = field(default_factory=dict)
    """HCA -> (state, link layer) of its port 1."""
    fabric_manager: str = "active"
    k3s_node: str | None = None
    """`k3s kubectl get nodes`' line (name, Ready, allocatable GPUs) where k3s runs (gpu_host)."""


def _query(machine: Machine) -> str:
    return "".join(
        f"{i}, {machine.name}, {machine.compute_cap}, {machine.driver}, {machine.memory_mib} MiB, "
        "Enabled, Enabled, 0x0000000000000001\n"
        for i in range(8)
    )


def _full_query(machine: Machine) -> str:
    head = (
        "\n==============NVSMI LOG==============\n\n"
        "Timestamp                                 : Fri Dec  4 20:00:00 2026\n"
        f"Driver Version                            : {machine.driver}\n"
        "CUDA Version                              : 13.0\n\n"
        "Attached GPUs                             : 8\n"
    )
    blocks = []
    for bus, (state, status) in zip(BUS_IDS, machine.fabric, strict=True):
        blocks.append(
            f"GPU {bus}\n"
            f"    Product Name                          : {machine.name}\n"
            "    Persistence Mode                      : Enabled\n"
            "    Fabric\n"
            f"        State                             : {state}\n"
            f"        Status                            : {status}\n"
            "        CliqueId                          : 4026\n"
            "        ClusterUUID                       : 9c6f5af3-53bf-49b5-a436-b66766c413c3\n"
            "        Health\n"
            "            Bandwidth                     : Full\n"
            "    Compute Mode                          : Default\n"
        )
    return head + "".join(blocks)


def _memory(machine: Machine) -> str:
    return "".join(
        f"GPU {bus}\n"
        "    FB Memory Usage\n"
        f"        Total                             : {machine.memory_mib} MiB\n"
        "        Reserved                          : 512 MiB\n"
        "        Used                              : 1 MiB\n"
        "    BAR1 Memory Usage\n"
        f"        Total                             : {machine.bar1_mib} MiB\n"
        "        Used                              : 1 MiB\n"
        "    Conf Compute Protected Memory Usage\n"
        "        Total                             : 0 MiB\n"
        for bus in BUS_IDS
    )


def _matrix(cell: str) -> str:
    header = "\t" + "\t".join(f"GPU{i}" for i in range(8)) + "\tCPU Affinity\tNUMA Affinity\n"
    rows = "".join(
        f"GPU{i}\t" + "\t".join(" X " if i == j else cell for j in range(8)) + "\t0-63\t0\n"
        for i in range(8)
    )
    return header + rows + "\nLegend:\n\n  X    = Self\n"


def _lspci(machine: Machine) -> str:
    flags = "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+" if machine.acs_redirecting else (
        "SrcValid- TransBlk- ReqRedir- CmpltRedir-")  # fmt: skip
    return "".join(
        f"{bridge} PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0)\n"
        "\tCapabilities: [200 v1] Access Control Services\n"
        "\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+\n"
        f"\t\tACSCtl:\t{flags} UpstreamFwd- EgressCtrl- DirectTrans-\n"
        for bridge in ("15:00.0", "16:01.0", "97:00.0", "98:01.0")
    )


def install(root: Path, machine: Machine) -> dict[str, str]:
    """Write the tools and the sysfs tree under root; the environment a session needs."""
    bin_dir, data = root / "bin", root / "data"
    bin_dir.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    files = {
        "query.csv": _query(machine),
        "driver.csv": "".join(f"{machine.driver}\n" for _ in range(8)),
        "q.txt": _full_query(machine),
        "q-memory.txt": _memory(machine),
        "topo.txt": _matrix(machine.link),
        "p2p.txt": _matrix("OK"),
        "lspci.txt": _lspci(machine),
        "banner.txt": f"| NVIDIA-SMI {machine.driver}   Driver Version: {machine.driver}   "
        "CUDA Version: 13.0     |\n",
        "fabricmanager.txt": machine.fabric_manager + "\n",
    }
    for name, text in files.items():
        (data / name).write_text(text)
    d = shlex.quote(str(data))
    tools = {
        "nvidia-smi": f"""case "$*" in
  --query-gpu=driver_version*) cat {d}/driver.csv ;;
  --query-gpu=*) cat {d}/query.csv ;;
  "-q -d MEMORY") cat {d}/q-memory.txt ;;
  -q) cat {d}/q.txt ;;
  "topo -m") cat {d}/topo.txt ;;
  "topo -p2p r") cat {d}/p2p.txt ;;
  "") cat {d}/banner.txt ;;
  *) echo "nvidia-smi stub: $*" >&2; exit 2 ;;
esac""",
        "lspci": f'[ "$1" = -vvv ] && cat {d}/lspci.txt',
        "systemctl": f'[ "$1 $2" = "is-active nvidia-fabricmanager" ] && cat {d}/fabricmanager.txt',
        "nvidia-container-runtime": "exit 0",
    }
    if machine.k3s_node:
        (data / "node.txt").write_text(machine.k3s_node + "\n")
        tools["k3s"] = f"""case "$*" in
  "kubectl get nodes"*) cat {d}/node.txt ;;
  "kubectl -n kube-system get ds"*) echo 1/1 ;;
  *) echo "k3s stub: $*" >&2; exit 2 ;;
esac"""
    for name, body in tools.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    sysfs = root / "sys"
    for hca, (state, layer) in machine.ib_ports.items():
        port = sysfs / "class" / "infiniband" / hca / "ports" / "1"
        port.mkdir(parents=True, exist_ok=True)
        code = {"ACTIVE": 4, "DOWN": 1, "INIT": 2}.get(state, 1)
        (port / "state").write_text(f"{code}: {state}\n")
        (port / "link_layer").write_text(f"{layer}\n")
    return {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "KIMIDEPLOY_SYSFS": str(sysfs)}  # fmt: skip
