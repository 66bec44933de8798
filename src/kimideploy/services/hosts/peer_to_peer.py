"""`host check`'s reading of GPU peer-to-peer: what the PCIe host's kernel has (IOMMU, HMM, ACS),
each GPU's BAR1, and the topology and P2P matrices nvidia-smi prints.

NCCL between GPUs without NVLink writes straight into the peer GPU's memory across PCIe. People
running 8x RTX PRO 6000 report all-reduces that hang after NCCL's init when the IOMMU translates
those writes or ACS redirects them to the root complex, and a BAR1 window smaller than the GPU's
memory leaves nothing to map the peer's buffers through. The gpu_host role sets what it can
(host_setup.peer_to_peer); these checks read back what the running kernel has.
"""

from __future__ import annotations

import re
from collections import Counter

from kimideploy.config.clusters import PeerToPeerSetup
from kimideploy.formats.check_result import CheckResult
from kimideploy.provision.inventory import IOMMU_KERNEL_ARGS

ACS_REDIRECTING = re.compile(r"\b(SrcValid|ReqRedir|CmpltRedir)\+")
"""ACS control flags that send a peer request up to the root complex (or drop it)."""

LINK_WORDS = {
    "PIX": "through one PCIe switch",
    "PXB": "through several PCIe switches",
    "PHB": "through the CPU's PCIe host bridge",
    "NODE": "between host bridges of one CPU",
    "SYS": "across the CPUs' interconnect",
}
"""nvidia-smi topo -m's legend, shortened; NV# is NVLink."""

P2P_WORDS = {
    "OK": "supported",
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "NS": "not supported",
    "U": "unknown",
}


def checks(setup: PeerToPeerSetup, found: dict[str, str]) -> list[CheckResult]:
    """The PCIe host's kernel and firmware state for peer-to-peer, against host_setup."""
    return [
        _iommu(setup, found.get("cmdline", "")),
        _hmm(setup, found.get("uvm-hmm", "").strip()),
        _acs(setup, found.get("acs", "")),
        *_bar1(found.get("bar1", "")),
    ]


def _iommu(setup: PeerToPeerSetup, cmdline: str) -> CheckResult:
    wanted = IOMMU_KERNEL_ARGS[setup.iommu].split()
    running = cmdline.split()
    iommu_words = [w for w in running if "iommu" in w] or ["none"]
    missing = [w for w in wanted if w not in running]
    return CheckResult(
        "IOMMU",
        not missing,
        f"kernel has {' '.join(iommu_words)}"
        + (f"; host_setup.peer_to_peer wants {' '.join(missing)}" if missing else ""),
        "`kimideploy host provision --cluster CLUSTER --tags p2p`, then reboot the host",
        blocking=False,
    )


def _hmm(setup: PeerToPeerSetup, value: str) -> CheckResult:
    disabled = value in ("Y", "1")
    shown = {"Y": "off", "1": "off", "N": "on", "0": "on"}.get(value, value or "unknown")
    return CheckResult(
        "nvidia_uvm HMM",
        disabled or not setup.uvm_disable_hmm,
        f"HMM {shown}" if value != "unloaded" else "nvidia_uvm not loaded",
        "`kimideploy host provision --tags p2p` writes uvm_disable_hmm=1; reboot (or reload "
        "nvidia_uvm with no GPU process running)",
        blocking=False,
    )


def _acs(setup: PeerToPeerSetup, text: str) -> CheckResult:
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or lines[-1] != "read":
        reason = lines[0] if lines else "no output"
        return CheckResult(
            "PCIe ACS",
            False,
            f"not read ({reason})",
            "run `host check` as a user with passwordless sudo, or install pciutils",
            blocking=False,
        )
    redirecting = [line.split()[0] for line in lines[:-1] if ACS_REDIRECTING.search(line)]
    detail = (
        f"redirection on at {len(redirecting)} bridges ({', '.join(redirecting[:6])}"
        f"{', ...' if len(redirecting) > 6 else ''})"
        if redirecting
        else f"no redirection ({len(lines) - 1} devices with ACS)"
    )
    return CheckResult(
        "PCIe ACS",
        not redirecting,
        detail,
        "`kimideploy host provision --tags p2p` (peer_to_peer.disable_acs) clears it at each "
        "boot; without it peer writes go through the root complex and NCCL may hang",
        blocking=setup.disable_acs,
    )


def _bar1(text: str) -> list[CheckResult]:
    rows = [line.split() for line in text.splitlines() if len(line.split()) == 3]
    if not rows:
        return []
    small = [f"{bus} ({bar1} MiB BAR1, {memory} MiB memory)" for bus, memory, bar1 in rows
             if _mib(bar1) < _mib(memory)]  # fmt: skip
    return [
        CheckResult(
            "BAR1",
            not small,
            "; ".join(small) if small else f"covers each GPU's memory ({rows[0][2]} MiB)",
            "enable Above 4G Decoding and Resizable BAR in the BIOS: with a small BAR1, "
            "peer-to-peer cannot map the peer's buffers",
        )
    ]


def _mib(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return 0.0


def parse_matrix(text: str) -> dict[tuple[str, str], str]:
    """The GPU x GPU cells of `nvidia-smi topo -m` or `topo -p2p r`, keyed (row, column) for
    row < column; the NIC columns and the affinity columns are left out."""
    header: list[str] = []
    cells: dict[tuple[str, str], str] = {}
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        if not header and words[0].startswith("GPU") and words[0] != "GPU" and "X" not in words:
            header = [w for w in words if re.fullmatch(r"GPU\d+", w)]
            continue
        if header and re.fullmatch(r"GPU\d+", words[0]):
            for column, value in zip(header, words[1:], strict=False):
                if int(column[3:]) > int(words[0][3:]):
                    cells[(words[0], column)] = value
    return cells


def topology_checks(found: dict[str, str]) -> list[CheckResult]:
    """`nvidia-smi topo -m`'s verdict and the P2P read matrix, for any GPU host."""
    results = []
    links = parse_matrix(found.get("topology", ""))
    if links:
        counts = Counter(links.values())
        summary = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
        nvlink = all(v.startswith("NV") for v in links.values())
        crossing = [pair for pair, kind in links.items() if kind == "SYS"]
        if nvlink:
            verdict = "every pair over NVLink"
        elif crossing:
            verdict = (
                f"{len(crossing)} pairs {LINK_WORDS['SYS']}: peer-to-peer there needs "
                "NCCL_P2P_LEVEL=SYS, and each ring step that crosses is bounded by the CPU link"
            )
        else:
            worst = max(links.values(), key=lambda v: list(LINK_WORDS).index(v)
                        if v in LINK_WORDS else -1)  # fmt: skip
            verdict = f"every pair within one CPU (at worst {LINK_WORDS.get(worst, worst)})"
        results.append(
            CheckResult("GPU topology", True, f"{summary} GPU pairs; {verdict}", blocking=False)
        )
    p2p = parse_matrix(found.get("p2p-read", ""))
    if p2p:
        refused = {pair: v for pair, v in p2p.items() if v != "OK"}
        named = [f"{a}-{b} {P2P_WORDS.get(v, v)}" for (a, b), v in sorted(refused.items())]
        detail = (
            f"{len(refused)} of {len(p2p)} pairs not supported: " + ", ".join(named[:6])
            if refused
            else f"peer reads supported between all {len(p2p)} pairs"
        )
        results.append(
            CheckResult(
                "GPU peer-to-peer",
                not refused,
                detail,
                "NCCL copies through host memory for these pairs (about half the bandwidth): "
                "check IOMMU, ACS and BAR1 above and the BIOS",
                blocking=False,
            )
        )
    return results
