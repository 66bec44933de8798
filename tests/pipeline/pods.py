"""Run what the rendered Jobs and the Deployment would run, on this CPU, with real vLLM.

Everything here starts from kimideploy's own rendering (`render_workload`): the workload spec is the
ConfigMap's `spec.json`, the vLLM arguments are the Deployment's or the online sidecar's `args`.
Two adaptations make a pod's command run on a machine with no GPU and no cluster, each in one
function so no test edits arguments by hand:

- `cpu_vllm_args`: the GPU-only `vllm serve` flags dropped or changed (below, with reasons);
- `localize`: the pod's mount points (/models, /data, ...) and Service URLs mapped to local ones.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import REPO
from tests.ports import free_port as free_port

from kimideploy.config.loading import LoadedProject, load_project
from kimideploy.config.specs import SPEC_FILE_NAME
from kimideploy.formats.drafter_swap import (
    DRAFTERS_ROOT_ENV,
    SPECULATION_SWITCH_ENV,
    STARTED_WITH_ENV,
    WANTED_SPEC_ENV,
)
from kimideploy.images import verify
from kimideploy.images.cpu_vllm import cpu_runtime_env
from kimideploy.plan.asks import WorkloadAsk
from kimideploy.plan.model import PlanRequest
from kimideploy.plan.pods import HOME_DIR
from kimideploy.services.rendering import render_workload

SHIM = Path(__file__).resolve().parent / "cpu_shim"


def _kimideploy_plugins() -> Path:
    """A folder holding kimideploy's distribution metadata with the `vllm.general_plugins`
    entry points pyproject.toml declares, as `pip install` writes them into the serve image: vLLM
    finds plugins by entry point, and the tier runs kimideploy from its sources."""
    import tomllib

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    folder = Path(tempfile.mkdtemp(prefix="kimideploy-plugins-"))
    atexit.register(shutil.rmtree, folder, True)
    dist = folder / "kimideploy-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kimideploy\nVersion: 0\n")
    lines = []
    for group, entries in declared.items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in entries.items()]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return folder


PLUGINS = _kimideploy_plugins()

# Flags (each with one value) dropped from the pod's arguments, and why.
GPU_ONLY_FLAGS: dict[str, str] = {
    "--tensor-parallel-size": "one CPU device; the pods' size is the node's GPU count",
    "--gpu-memory-utilization": "the CPU build sizes its KV cache from VLLM_CPU_KVCACHE_SPACE",
    "--dtype": "this CPU has AVX2 only: vLLM's CPU kernels need float32 (pods use bfloat16)",
    "--host": "listen on the test's own address, not 0.0.0.0",
    "--port": "a free port of the test's choosing",
}
# Added on CPU: float32 (above), and no CUDA graphs or torch.compile (start-up in seconds on 2
# cores; the code paths under test are the same eager ones).
CPU_ONLY_FLAGS = ["--enforce-eager", "--dtype", "float32"]


def cpu_vllm_args(args: list[str], host: str, port: int) -> list[str]:
    """The pod's `vllm serve` arguments as they must be on this CPU (GPU_ONLY_FLAGS), listening on
    `host:port` instead of 0.0.0.0 and the pod's port. Everything else is passed unchanged, so vLLM
    parses and validates exactly the speculative and extraction flags the cluster would get."""
    out: list[str] = []
    values = iter(args)
    for arg in values:
        if arg in GPU_ONLY_FLAGS:
            next(values)
            continue
        out.append(arg)
    return [*out, *CPU_ONLY_FLAGS, "--host", host, "--port", str(port)]


def localize(value: Any, roots: dict[str, Path | str]) -> Any:
    """Every string in a spec or argument list with a pod path or URL prefix replaced by its local
    counterpart, inside JSON-valued arguments too (`--speculative-config` names the drafter's
    path, `--kv-transfer-config` the scratch directory)."""
    if isinstance(value, dict):
        return {k: localize(v, roots) for k, v in value.items()}
    if isinstance(value, list):
        return [localize(v, roots) for v in value]
    if isinstance(value, str):
        if value.startswith(("{", "[")):
            try:
                return json.dumps(localize(json.loads(value), roots))
            except ValueError:
                return value
        for prefix, local in sorted(roots.items(), key=lambda kv: -len(kv[0])):
            if value == prefix or value.startswith(prefix + "/"):
                return str(local) + value[len(prefix) :]
    return value


@dataclass(frozen=True)
class Rendered:
    """One workload as kimideploy renders it: the pod's spec and its vLLM command, if any."""

    spec: dict[str, Any]
    vllm_model: str | None
    vllm_args: list[str]
    manifests: list[dict[str, Any]]
    secret_env: dict[str, str]
    """The main container's variables taken from Secrets, with the test's values (SECRETS)."""
    ready_path: str
    """The rendered readiness probe's path (serve only)."""
    vllm_env: dict[str, str] = field(default_factory=dict)
    """The vLLM container's own literal VLLM_* variables (a calibration revision's dev mode) and the
    drafter keeper's."""


SECRETS = {("pipeline-api-key", "token"): "kd-pipeline-key-7c1e"}
"""What the test's Secrets would hold (the pipeline project's serve.api_key names the first)."""


def _secret_env(pod: dict[str, Any]) -> dict[str, str]:
    resolved = {}
    for container in pod.get("containers", []):
        for entry in container.get("env", []):
            ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                resolved[entry["name"]] = SECRETS[(ref["name"], ref["key"])]
    return resolved


KEEPER_ENV = (STARTED_WITH_ENV, WANTED_SPEC_ENV, DRAFTERS_ROOT_ENV, SPECULATION_SWITCH_ENV)
"""The drafter keeper's variables (workloads/drafter_swap.py), passed to the tier's vLLM too."""
COMPILE_CACHE_VARIABLES = ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
                           "FLASHINFER_WORKSPACE_BASE")  # fmt: skip


def rendered(loaded: LoadedProject, workload: str, drafter: str | None = None,
             overrides: tuple[str, ...] = (), ask: WorkloadAsk | None = None,
             cluster: str = "cpu") -> Rendered:  # fmt: skip
    """Render `workload` for a pipeline cluster: spec.json and the vLLM container's args."""
    request = PlanRequest(workload, cluster, drafter, overrides=overrides, run_id="p1",
                          ask=ask)  # fmt: skip
    manifests = [dict(m) for m in render_workload(loaded, request).objects]
    config_map = next(m for m in manifests if m["kind"] == "ConfigMap")
    spec = json.loads(config_map["data"][SPEC_FILE_NAME])
    model, args, secret_env, ready, vllm_env = None, [], {}, "/v1/models", {}
    for manifest in manifests:
        pod = (manifest.get("spec") or {}).get("template", {}).get("spec", {})
        secret_env.update(_secret_env(pod))
        for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            if container.get("command", [])[:2] == ["vllm", "serve"]:
                model, args = container["command"][2], list(container["args"])
                # The compile cache's folders are left out: the tier's engines run eager.
                vllm_env = {e["name"]: e["value"] for e in container.get("env", [])
                            if (e["name"].startswith("VLLM_") or e["name"] in KEEPER_ENV)
                            and "value" in e
                            and e["name"] not in COMPILE_CACHE_VARIABLES}  # fmt: skip
            probe = container.get("readinessProbe") or {}
            if "httpGet" in probe:  # vLLM's (a capture sidecar's is a TCP probe)
                ready = probe["httpGet"]["path"]
    return Rendered(spec, model, args, manifests, secret_env, ready, vllm_env)


TIER_CONFIG = Path(__file__).resolve().parent / "kimideploy.yaml"
TIER_IMAGE = "vllm-0.32-kimi"


@functools.cache
def image_overlay(python: Path) -> Path:
    """The venv's vLLM with the tier image's patches applied (cached by patch set): what the
    image runs, so the tier serves what a pod serves (patch 0002's switch included)."""
    image = load_project(TIER_CONFIG).project.images[TIER_IMAGE]
    return verify.patched_overlay(image, python)


def cpu_env(python: Path, **extra: str) -> dict[str, str]:
    """The environment of a CPU vLLM process: the venv's runtime settings, the image's patched
    vLLM (image_overlay), kimideploy's sources, the test-only connector shim
    (tests/pipeline/cpu_shim) and kimideploy's own vLLM plugin entry points (PLUGINS) on the
    path."""
    venv = python.parent.parent
    path = f"{image_overlay(python)}:{REPO / 'src'}:{SHIM}:{PLUGINS}:{REPO}"
    return {
        **os.environ,
        **cpu_runtime_env(venv),
        "PYTHONPATH": path,
        "VLLM_LOGGING_LEVEL": "WARNING",
        **extra,
    }


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    ready_path: str = "/v1/models"

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)


@dataclass(frozen=True)
class PodMounts:
    """What a rendered pod may write, as local folders: its read-write claims and its emptyDirs
    (/tmp and HOME get a fresh folder per pod, as an emptyDir is). Everything else is read-only:
    the pods' containers run with readOnlyRootFilesystem, and so do their processes here."""

    writable: tuple[Path, ...]
    home: Path
    tmp: Path

    def env(self) -> dict[str, str]:
        return {"HOME": str(self.home), "TMPDIR": str(self.tmp)}


def pod_mounts(rendered: Rendered, roots: dict[str, Path | str], pod_dir: Path) -> PodMounts:
    """The read-write mounts of the rendered pod (every container's), mapped to local folders.

    Its /tmp is a short folder of the system's temporary directory, as a pod's is short: vLLM
    binds ZMQ IPC sockets at $TMPDIR/<uuid>, and a socket path over 107 bytes is refused
    (sockaddr_un), which a folder under pytest's basetemp reached (104 bytes in CI; a longer
    --basetemp failed every serve). `pod_dir/tmp` links to it; it is removed when pytest exits."""
    home, tmp = pod_dir / "home", Path(tempfile.mkdtemp(prefix="pod-"))
    atexit.register(shutil.rmtree, tmp, True)
    link = pod_dir / "tmp"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to(tmp)
    writable: list[Path] = [home, tmp]
    for manifest in rendered.manifests:
        pod = (manifest.get("spec") or {}).get("template", {}).get("spec", {})
        for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            for mount in container.get("volumeMounts", []):
                path = mount["mountPath"]
                if mount.get("readOnly") or path in ("/tmp", HOME_DIR, "/dev/shm"):
                    continue  # /dev/shm: a tmpfs here as in the pod (emptyDir medium Memory)
                local = localize(path, roots)
                if local == path:
                    raise AssertionError(f"{path}: a writable mount the tier does not map")
                writable.append(Path(local))
    for folder in writable:
        folder.mkdir(parents=True, exist_ok=True)
    return PodMounts(tuple(dict.fromkeys(writable)), home, tmp)


# In a private mount namespace: each writable folder bound onto itself (a mount of its own),
# then the root remounted read-only: what is not one of those folders cannot be written.
READ_ONLY_ROOT = """set -e
while [ "$1" != "--" ]; do mount --bind "$1" "$1"; shift; done
shift
mount -o remount,bind,ro /
exec "$@"
"""


def sandboxed(command: list[str], mounts: PodMounts) -> list[str]:
    """`command` with a read-only root and only the pod's writable mounts writable."""
    binds = [str(path) for path in mounts.writable]
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", READ_ONLY_ROOT,
            "read-only-root", *binds, "--", *command]  # fmt: skip


def start_vllm(python: Path, model: str, args: list[str], log: Path, netns: str | None = None,
               env: dict[str, str] | None = None, ready_path: str = "/v1/models",
               mounts: PodMounts | None = None) -> Server:  # fmt: skip
    """`vllm serve MODEL ARGS` with the CPU venv (in network namespace `netns` when given),
    `env` added (a rendered container's Secret-backed variables), with the pod's read-only
    root when `mounts` says what it may write."""
    host = args[args.index("--host") + 1]
    port = args[args.index("--port") + 1]
    command = [str(python), "-m", "vllm.entrypoints.cli.main", "serve", model, *args]
    if mounts is not None:
        command = sandboxed(command, mounts)
        env = {**(env or {}), **mounts.env()}
    if netns:
        command = ["ip", "netns", "exec", netns, *command]
    handle = log.open("wb")
    process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT,
                               env=cpu_env(python, **(env or {})),
                               start_new_session=True)  # fmt: skip
    return Server(f"http://{host}:{port}", process, log, ready_path)


def wait_ready(servers: list[Server], timeout: float = 420) -> None:
    """Until every server's readiness path answers (the probe kimideploy renders)."""
    deadline = time.monotonic() + timeout
    pending = list(servers)
    while pending and time.monotonic() < deadline:
        for server in list(pending):
            if server.process.poll() is not None:
                tail = server.log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"vLLM exited with {server.process.returncode}:\n{tail}")
            try:
                with urllib.request.urlopen(server.url + server.ready_path, timeout=5) as response:
                    if response.status == 200:
                        pending.remove(server)
            except OSError:
                pass
        time.sleep(2)
    if pending:
        tail = pending[0].log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"vLLM not ready after {timeout:.0f} s:\n{tail}")


@contextmanager
def serving(python: Path, model: str, args: list[str], log: Path) -> Iterator[Server]:
    server = start_vllm(python, model, args, log)
    try:
        wait_ready([server])
        yield server
    finally:
        server.stop()


def run_workload(python: Path, name: str, spec: dict[str, Any], where: Path,
                 timeout: float = 900, mounts: PodMounts | None = None,
                 **env: str) -> tuple[int, str, str]:  # fmt: skip
    """`python -m kimideploy.workloads NAME --spec spec.json`, as the pod's container runs it
    (with the pod's read-only root when `mounts` says what it may write)."""
    path = where / f"{name}-spec.json"
    path.write_text(json.dumps(spec))
    command = [str(python), "-m", "kimideploy.workloads", name, "--spec", str(path)]
    if mounts is not None:
        command, env = sandboxed(command, mounts), {**env, **mounts.env()}
    done = subprocess.run(command, capture_output=True, text=True, env=cpu_env(python, **env),
                          timeout=timeout)  # fmt: skip
    return done.returncode, done.stdout, done.stderr


def events(stdout: str, kind: str) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return [e for e in found if e.get("event") == kind]
