"""`kimideploy host check`: is this machine ready? One SSH round trip, a table of checks with fixes.

The probe is one POSIX shell script whose sections the parsers below read; every check says what
it found, what is wrong and how to fix it, and whether it blocks deployment.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

from kimideploy.config.clusters import Cluster
from kimideploy.config.images import MIN_DRIVER_FOR_CUDA, Image
from kimideploy.config.project import Project
from kimideploy.formats.check_result import CheckResult
from kimideploy.formats.gpuinfo import arch_of, parse_query, version_tuple
from kimideploy.services.hosts import peer_to_peer

SECTION = re.compile(r"^### (\S+)$", re.M)


def probe_script() -> str:
    """The read-only shell script run on the host as `sh -s -- MODEL_PATH`."""
    return (resources.files("kimideploy.remote.payloads") / "host_probe.sh").read_text()


def sections(output: str) -> dict[str, str]:
    parts = SECTION.split(output)
    return {parts[i]: parts[i + 1].strip("\n") for i in range(1, len(parts) - 1, 2)}


def parse_gpus(text: str) -> list[dict[str, str]] | None:
    """Rows of the --query-gpu CSV; None when nvidia-smi did not run."""
    if not text.rstrip().endswith("rc=0"):
        return None
    return parse_query(text)


def parse_cuda_version(banner: str) -> str | None:
    match = re.search(r"CUDA Version:\s*([\d.]+)", banner)
    return match.group(1) if match else None


def evaluate(project: Project, cluster: Cluster, image: Image, output: str) -> list[CheckResult]:
    """Every check for one host of `cluster`, from the probe's output."""
    found = sections(output)
    setup = cluster.host_setup
    assert setup is not None
    checks = _gpu_checks(cluster, image, found)
    # The checkpoint this cluster serves: its model_variant's weights, else model's.
    served = project.model_variants.get(cluster.model_variant or "") or project.model
    if cluster.weights_via == "host":
        # A shared models claim is not this host's disk: `host check` reads it from a pod.
        checks += _disk_checks(served.weights_gb, setup.model_path, found)
    if setup.role == "gpu_host":
        checks += _k3s_checks(cluster, found)
        checks += peer_to_peer.checks(setup.peer_to_peer, found)
    else:
        checks += _fabric_checks(setup.fabric_manager, found)
        if setup.infiniband:
            checks += _infiniband_checks(cluster.network.ib_hcas, found)
    if gpus_found(found):
        checks += peer_to_peer.topology_checks(found)
    checks += memlock_checks(cluster, found.get("memlock", ""))
    return checks


def parse_memlock(text: str) -> dict[str, str]:
    """{unit: LimitMEMLOCK} of the container runtimes installed on the host."""
    units = {}
    for line in text.splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if fields.get("LoadState") == "loaded" and "unit" in fields:
            units[fields["unit"]] = fields.get("LimitMEMLOCK", "")
    return units


def memlock_checks(cluster: Cluster, text: str) -> list[CheckResult]:
    """Locked memory for pods: what the container runtime passes to every container. NCCL over
    InfiniBand pins its buffers, and IPC_LOCK in a pod does not reach the non-root trainer, so
    only the runtime's LimitMEMLOCK can give it the room (blocking where the cluster's NCCL
    crosses nodes over RDMA, a warning elsewhere)."""
    units = parse_memlock(text)
    if not units:
        return []
    low = {u: v for u, v in units.items() if v != "infinity"}
    name = "locked memory for pods"
    if not low:
        return [CheckResult(name, True, ", ".join(f"{u}: LimitMEMLOCK=infinity" for u in units))]
    shown = ", ".join(f"{u}: LimitMEMLOCK={v or '?'}" for u, v in low.items())
    fix = (
        "a systemd drop-in with [Service] LimitMEMLOCK=infinity for "
        + " and ".join(f"{u}.service" for u in low)
        + ", `systemctl daemon-reload` and a restart (running containers keep theirs): "
        "`kimideploy host provision` does it"
    )
    rdma = bool(cluster.network.rdma_resource)
    return [
        CheckResult(
            name,
            False,
            f"{shown}: NCCL over InfiniBand cannot pin its buffers in the pods",
            fix,
            blocking=rdma,
        )
    ]


def gpus_found(found: dict[str, str]) -> bool:
    return parse_gpus(found.get("gpus", "")) is not None


def _gpu_checks(cluster: Cluster, image: Image, found: dict[str, str]) -> list[CheckResult]:
    gpus = parse_gpus(found.get("gpus", ""))
    if gpus is None:
        fix = "install the driver: `kimideploy host provision` (gpu_host) or ask the provider"
        return [
            CheckResult(
                "nvidia-smi",
                False,
                (found.get("gpus", "").splitlines()[0:1] and found["gpus"].splitlines()[0])
                or "no output",
                fix,
            )
        ]
    wanted = cluster.gpu
    checks = [
        CheckResult(
            "GPU count",
            len(gpus) == wanted.per_node,
            f"{len(gpus)} GPUs (profile: {wanted.per_node})",
            "check `nvidia-smi -L`; a missing GPU needs a reseat or an RMA",
        )
    ]
    names = {g["name"] for g in gpus}
    label = {n.replace(" ", "-") for n in names}
    checks.append(
        CheckResult(
            "GPU model",
            label == {wanted.product},
            ", ".join(sorted(names)),
            f"the profile expects {wanted.product}; fix clusters.<name>.gpu.product or the host",
        )
    )
    caps = {arch_of(g["compute_cap"]) for g in gpus}
    checks.append(
        CheckResult(
            "compute capability",
            caps == {wanted.arch} and wanted.arch in image.cuda_archs,
            f"{', '.join(sorted(caps))} "
            f"(profile {wanted.arch}; image {', '.join(image.cuda_archs)})",
            "build the image for this architecture (images.<name>.cuda_archs) and set gpu.arch",
        )
    )
    driver = min((g["driver_version"] for g in gpus), key=version_tuple)
    checks += _driver_checks(cluster, image, driver, parse_cuda_version(found.get("banner", "")))
    persistence = [g["index"] for g in gpus if g.get("persistence_mode") != "Enabled"]
    checks.append(
        CheckResult(
            "persistence mode",
            not persistence,
            "off on GPUs " + ",".join(persistence) if persistence else "on",
            "sudo nvidia-smi -pm 1 (the gpu_host role enables nvidia-persistenced)",
            blocking=False,
        )
    )
    ecc = [g["index"] for g in gpus if g.get("ecc.mode.current") == "Disabled"]
    checks.append(
        CheckResult(
            "ECC",
            not ecc,
            "disabled on GPUs " + ",".join(ecc) if ecc else "enabled or not applicable",
            "sudo nvidia-smi -e 1 and reboot",
            blocking=False,
        )
    )
    throttled = [
        g["index"]
        for g in gpus
        if g.get("clocks_event_reasons.active", "0x0").strip()
        not in ("0x0000000000000000", "0x0000000000000001", "0x0")
    ]
    checks.append(
        CheckResult(
            "clocks",
            not throttled,
            "throttled on GPUs " + ",".join(throttled) if throttled else "no throttling",
            "check cooling and power limits (nvidia-smi -q -d PERFORMANCE)",
            blocking=False,
        )
    )
    return checks


def _driver_checks(
    cluster: Cluster, image: Image, driver: str, cuda: str | None
) -> list[CheckResult]:
    checks = []
    needed = MIN_DRIVER_FOR_CUDA.get(image.cuda or "", "0")
    checks.append(
        CheckResult(
            "driver",
            version_tuple(driver) >= version_tuple(needed),
            f"{driver} (CUDA {image.cuda} in the image needs >= {needed})",
            "upgrade the driver: raise host_setup.nvidia_driver_version, then "
            "`kimideploy host provision`",
        )
    )
    if cuda is not None and image.cuda:
        checks.append(
            CheckResult(
                "CUDA",
                version_tuple(cuda) >= version_tuple(image.cuda),
                f"driver supports CUDA {cuda}; the image has {image.cuda}",
                "upgrade the driver",
            )
        )
    setup = cluster.host_setup
    if setup is not None and setup.role == "gpu_host":
        pinned = setup.nvidia_driver_version
        checks.append(
            CheckResult(
                "driver pin",
                driver == pinned,
                f"{driver} (pinned {pinned})",
                "run `kimideploy host provision --tags driver` to converge",
                blocking=False,
            )
        )
    return checks


def _disk_checks(weights_gb: float, model_path: str, found: dict[str, str]) -> list[CheckResult]:
    if found.get("marker", "").strip():
        return [
            CheckResult("model on disk", True, "a synced model revision is present (marker found)")
        ]
    fields = found.get("disk", "").split()
    if len(fields) < 4 or not fields[3].isdigit():
        return [
            CheckResult(
                "free space",
                False,
                f"cannot read free space of {model_path}: {found.get('disk', '')}",
                f"create {model_path} on the NVMe disk",
            )
        ]
    free_gb = int(fields[3]) / 1e9
    need = weights_gb * 1.1
    return [
        CheckResult(
            "free space",
            free_gb >= need,
            f"{free_gb:,.0f} GB free on {model_path}, need {need:,.0f} GB",
            "free space or point host_setup.model_path at a larger disk",
        )
    ]


def _k3s_checks(cluster: Cluster, found: dict[str, str]) -> list[CheckResult]:
    runtime = found.get("runtime", "")
    checks = [
        CheckResult(
            "container runtime",
            runtime.rstrip().endswith("rc=0"),
            runtime.splitlines()[0] if runtime else "?",
            "install the NVIDIA container toolkit: `kimideploy host provision --tags toolkit`",
        )
    ]
    node = [
        line.split()
        for line in found.get("node", "").splitlines()
        if line and not line.startswith("rc=")
    ]
    ready = (
        bool(node)
        and all(len(n) >= 2 and n[1] == "True" for n in node)
        and found["node"].rstrip().endswith("rc=0")
    )
    checks.append(
        CheckResult(
            "k3s",
            ready,
            " ".join(" ".join(n) for n in node) or "no node",
            "`kimideploy host provision --tags k3s`; then `sudo k3s kubectl get nodes`",
        )
    )
    allocatable = node[0][2] if node and len(node[0]) > 2 else "0"
    checks.append(
        CheckResult(
            "allocatable nvidia.com/gpu",
            allocatable == str(cluster.gpu.per_node),
            f"{allocatable} (expected {cluster.gpu.per_node})",
            "check the device plugin pod logs in kube-system",
        )
    )
    plugin = found.get("device-plugin", "").splitlines()
    healthy = (
        bool(plugin)
        and re.fullmatch(r"(\d+)/\1", plugin[0] or "") is not None
        and plugin[0] != "0/0"
    )
    checks.append(
        CheckResult(
            "device plugin",
            healthy,
            plugin[0] if plugin else "not found",
            "`kimideploy host provision --tags device-plugin`",
        )
    )
    return checks


def _fabric_checks(fabric_manager: bool, found: dict[str, str]) -> list[CheckResult]:
    """The fabric manager runs, and every GPU registered with the NVLink fabric: a GPU whose
    registration failed runs, but NCCL finds no NVLink to it."""
    if not fabric_manager:
        return []
    state = found.get("fabricmanager", "").strip() or "unknown"
    checks = [
        CheckResult(
            "fabric manager",
            state == "active",
            state,
            "NVSwitch needs nvidia-fabricmanager at the driver's version; ask the provider",
        )
    ]
    if gpus_found(found):
        registrations = parse_fabric(found.get("fabric", ""))
        unregistered = [
            f"{bus} {state}/{status}"
            for bus, state, status in registrations
            if (state, status) != ("Completed", "Success")
        ]
        checks.append(
            CheckResult(
                "GPU fabric registration",
                bool(registrations) and not unregistered,
                "; ".join(unregistered)
                if unregistered
                else f"{len(registrations)} GPUs Completed/Success"
                if registrations
                else "nvidia-smi -q shows no Fabric section",
                "ask the provider: the GPU's NVLink fabric registration failed (restart "
                "nvidia-fabricmanager, reset the GPU); NCCL would route around it over PCIe",
            )
        )
    return checks


def parse_fabric(text: str) -> list[tuple[str, str, str]]:
    """(bus id, state, status) per GPU from the probe's fabric section."""
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3:
            rows.append((parts[0], parts[1], parts[2]))
    return rows


def parse_ports(text: str) -> list[tuple[str, str, str, str]]:
    """(device, port, state, link layer) per InfiniBand port from the probe."""
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            rows.append((parts[0], parts[1], parts[2], parts[3] if len(parts) > 3 else ""))
    return rows


def _infiniband_checks(ib_hcas: list[str], found: dict[str, str]) -> list[CheckResult]:
    """The compute HCAs NCCL is told to use, and nothing else: front-end, storage and BlueField
    ports may be down, or Ethernet, on a healthy node."""
    ports = parse_ports(found.get("infiniband", ""))
    if ib_hcas:
        wanted = []
        missing = []
        for hca in ib_hcas:
            device, _, port = hca.partition(":")
            matched = [p for p in ports if p[0] == device and (not port or p[1] == port)]
            wanted += matched
            if not matched:
                missing.append(hca)
        scope = "compute HCA"
    else:
        wanted = [p for p in ports if p[3] == "InfiniBand"]
        missing = []
        scope = "InfiniBand"
    down = [f"{d}/{p} {state}" for d, p, state, _ in wanted if state != "ACTIVE"]
    problems = down + [f"{hca} not on this node" for hca in missing]
    detail = (
        "; ".join(problems)
        if problems
        else f"{len(wanted)}/{len(wanted)} {scope} ports ACTIVE"
        if wanted
        else "no InfiniBand port found"
    )
    fix = (
        "an HCA network.ib_hcas names is not on this node: correct the list (`ibstat -l`)"
        if missing
        else "ask the provider; multi-node NCCL needs them"
    )
    checks = [CheckResult("InfiniBand", bool(wanted) and not problems, detail, fix)]
    if not ib_hcas:
        checks.append(
            CheckResult(
                "compute HCAs named",
                False,
                "network.ib_hcas is empty: every InfiniBand port is checked and NCCL chooses "
                "among all HCAs",
                "name the compute HCAs in clusters.<name>.network.ib_hcas",
                blocking=False,
            )
        )
    loaded = found.get("peermem", "0").strip() not in ("", "0")
    checks.append(
        CheckResult(
            "nvidia_peermem",
            loaded,
            "loaded" if loaded else "not loaded",
            "`kimideploy host provision` loads it (GPUDirect RDMA)",
            blocking=False,
        )
    )
    return checks


def rows(host: str, checks: list[CheckResult]) -> list[dict[str, Any]]:
    return [
        {
            "host": host,
            "check": c.name,
            "status": c.status,
            "detail": c.detail,
            "fix": "" if c.ok else c.fix,
        }
        for c in checks
    ]
