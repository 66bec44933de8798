"""A real Kubernetes control plane on 127.0.0.1 for tests, with KWOK-simulated 8-GPU nodes.

Started by `scripts/testcluster/up` and by the integration tests' session fixture. Everything binds
to 127.0.0.1 on free ports under one temporary directory; `down` stops only the PIDs recorded in
that directory's state.json, in reverse start order, and removes the directory.

Simulated nodes and storage classes come from the cluster profiles of a kimideploy.yaml, so a
pod rendered for `b300` lands on a node that looks like a B300 node (GPU product label, taints,
`nvidia.com/gpu: 8`). Failure hooks are pod annotations matched by weighted KWOK stages (written
here, see HOOK_STAGES); KWOK's own stages are read from the build's copy of its module.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from simulated import PROFILE_LABEL, SIMULATED_LABEL, simulated_objects
from stages import (
    AWAIT_HOOK,
    CRASH_LOOP,
    FAIL_INDEX,
    HOOK_STAGES,
    IMAGE_PULL_ERROR,
    NEVER_READY,
    RUN_DURATION,
)

HERE = Path(__file__).resolve().parent
__all__ = [
    "CRASH_LOOP",
    "FAIL_INDEX",
    "IMAGE_PULL_ERROR",
    "NEVER_READY",
    "PROFILE_LABEL",
    "RUN_DURATION",
    "HarnessError",
    "TestCluster",
    "down",
    "serve_logs",
    "up",
    "write_container_log",
]
REPO = HERE.parents[1]


UPSTREAM_STAGES = (
    "node__fast__node-initialize.yaml",
    "node__heartbeat-with-lease__node-heartbeat-with-lease.yaml",
    "pod__fast__pod-ready.yaml",
    "pod__fast__pod-complete.yaml",
    "pod__fast__pod-delete.yaml",
    "volume__fast__pvc-provision.yaml",
    "volume__fast__pvc-delete.yaml",
    "volume__fast__pv-delete.yaml",
)


class HarnessError(RuntimeError):
    """The control plane could not be built or started; the message says which step and why."""


@dataclass
class TestCluster:
    root: Path
    bin_dir: Path
    kubeconfig: Path
    api_port: int
    kwok_port: int
    token: str
    restricted_token: str = ""
    pids: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)

    def save(self) -> None:
        data = asdict(self)
        data = {k: str(v) if isinstance(v, Path) else v for k, v in data.items()}
        (self.root / "state.json").write_text(json.dumps(data, indent=2))

    @classmethod
    def load(cls, root: Path) -> TestCluster:
        data = json.loads((root / "state.json").read_text())
        for key in ("root", "bin_dir", "kubeconfig"):
            data[key] = Path(data[key])
        return cls(**data)

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        command = [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise HarnessError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def wait_established(self, *crds: str, timeout_s: float = 60.0) -> None:
        """`kubectl wait --for=condition=Established` on just-applied CRDs. kubectl's wait fails at
        once, instead of waiting, on a CRD whose status has no conditions yet (".status.conditions
        accessor error: <nil>"), which a loaded API server shows for a moment after the apply."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.kubectl("wait", "--for=condition=Established", f"--timeout={timeout_s:.0f}s",
                             *crds)  # fmt: skip
                return
            except HarnessError as exc:
                if "accessor error" not in str(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(0.5)


def find_bin_dir() -> Path:
    """The newest build under ~/.cache/kimideploy/testbins (or $KIMIDEPLOY_TESTBINS)."""
    override = os.environ.get("KIMIDEPLOY_TESTBINS")
    if override:
        return Path(override)
    cache = Path(os.environ.get("KIMIDEPLOY_CACHE", Path.home() / ".cache" / "kimideploy"))
    candidates = sorted((cache / "testbins").glob("k8s-*"), key=lambda p: p.stat().st_mtime)
    needed = (
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
        "kubectl",
    )
    for candidate in reversed(candidates):
        if all((candidate / name).is_file() for name in needed):
            return candidate
    raise HarnessError(
        f"no built control plane under {cache / 'testbins'}: run scripts/testcluster/build"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise HarnessError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def make_pki(pki: Path) -> None:
    """A CA, serving certificates for the API server and KWOK (127.0.0.1), a service-account key."""
    pki.mkdir(parents=True)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=kimideploy-test-ca",
        "-keyout",
        str(pki / "ca.key"),
        "-out",
        str(pki / "ca.crt"),
    )
    for name, sans in (
        ("apiserver", "IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc"),
        ("kwok", "IP:127.0.0.1,DNS:localhost"),
    ):
        ext = pki / f"{name}.ext"
        ext.write_text(f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\n")
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            str(pki / f"{name}.key"),
            "-out",
            str(pki / f"{name}.csr"),
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            str(pki / f"{name}.csr"),
            "-CA",
            str(pki / "ca.crt"),
            "-CAkey",
            str(pki / "ca.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            str(ext),
            "-out",
            str(pki / f"{name}.crt"),
        )
    _openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
    _openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))


def write_kubeconfig(path: Path, ca: Path, port: int, token: str) -> None:
    import base64

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "kimideploy-test",
                "cluster": {
                    "server": f"https://127.0.0.1:{port}",
                    "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode(),
                },
            }
        ],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [
            {"name": "kimideploy-test", "context": {"cluster": "kimideploy-test", "user": "admin"}}
        ],
        "current-context": "kimideploy-test",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)


def _start(cluster: TestCluster, name: str, args: list[str]) -> None:
    log = (cluster.root / "logs" / f"{name}.log").open("w")
    process = subprocess.Popen(
        args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    cluster.pids.append(process.pid)
    cluster.names.append(name)
    cluster.save()


def _wait(what: str, check: Any, cluster: TestCluster, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        for pid, name in zip(cluster.pids, cluster.names, strict=True):
            if not _alive(pid):
                tail = (cluster.root / "logs" / f"{name}.log").read_text()[-3000:]
                raise HarnessError(f"{name} exited while waiting for {what}:\n{tail}")
        try:
            if check():
                return
        except Exception as exc:  # any failure means "not yet"
            last = str(exc)
        time.sleep(0.2)
    raise HarnessError(f"timed out after {timeout:.0f}s waiting for {what} ({last})")


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        return waited == 0
    except ChildProcessError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


def _http_ok(url: str, ca: Path | None = None, token: str | None = None) -> bool:
    context = ssl.create_default_context(cafile=str(ca)) if ca else None
    request = urllib.request.Request(
        url, headers={"Authorization": f"Bearer {token}"} if token else {}
    )
    with urllib.request.urlopen(request, context=context, timeout=2) as response:
        return bool(response.status == 200)


def start_etcd(cluster: TestCluster) -> int:
    client, peer = free_port(), free_port()
    _start(
        cluster,
        "etcd",
        [
            str(cluster.bin_dir / "etcd"),
            "--name=default",
            f"--data-dir={cluster.root / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{client}",
            f"--advertise-client-urls=http://127.0.0.1:{client}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync",
            "--listen-metrics-urls=",
            "--log-level=warn",
        ],
    )
    _wait("etcd health", lambda: _http_ok(f"http://127.0.0.1:{client}/health"), cluster)
    return client


def start_apiserver(cluster: TestCluster, etcd_port: int) -> None:
    pki = cluster.root / "pki"
    tokens = cluster.root / "tokens.csv"
    # A second user with no RBAC bindings at all, for tests of forbidden requests.
    tokens.write_text(
        f'{cluster.token},admin,admin-uid,"system:masters"\n'
        f"{cluster.restricted_token},nobody,nobody-uid\n"
    )
    tokens.chmod(0o600)
    _start(
        cluster,
        "kube-apiserver",
        [
            str(cluster.bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={cluster.api_port}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--token-auth-file={tokens}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--endpoint-reconciler-type=none",
            f"--kubelet-certificate-authority={pki / 'ca.crt'}",
            "--kubelet-preferred-address-types=InternalIP",
            f"--cert-dir={pki}",
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            "--event-ttl=1h",
        ],
    )
    url = f"https://127.0.0.1:{cluster.api_port}/readyz"
    _wait(
        "kube-apiserver /readyz", lambda: _http_ok(url, pki / "ca.crt", cluster.token), cluster, 90
    )


def start_controllers(cluster: TestCluster) -> None:
    pki, kubeconfig = cluster.root / "pki", str(cluster.kubeconfig)
    auth = [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        "--leader-elect=false",
    ]
    _start(
        cluster,
        "kube-controller-manager",
        [
            str(cluster.bin_dir / "kube-controller-manager"),
            *auth,
            f"--secure-port={free_port()}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            "--use-service-account-credentials=false",
            "--controllers=*,-nodeipam,-service-lb-controller",
            "--concurrent-deployment-syncs=10",
            "--concurrent-job-syncs=10",
        ],
    )
    _start(
        cluster,
        "kube-scheduler",
        [
            str(cluster.bin_dir / "kube-scheduler"),
            *auth,
            f"--secure-port={free_port()}",
        ],
    )


def stage_files(cluster: TestCluster) -> list[Path]:
    """Upstream stages (PVC provisioning widened to any storage class) plus the test hooks."""
    source = cluster.bin_dir / "kwok-stages"
    target = cluster.root / "stages"
    target.mkdir()
    files = []
    for name in UPSTREAM_STAGES:
        text = (source / name).read_text()
        if name == "volume__fast__pvc-provision.yaml":
            # Upstream provisions only its own class; the profiles name local-path, shared-fs, ...
            text = text.replace(
                "self.spec.storageClassName == 'kwok-volume'", "has(self.spec.storageClassName)"
            )
        (target / name).write_text(text)
        files.append(target / name)
    hooks = target / "kimideploy-test-hooks.yaml"
    hooks.write_text(yaml.safe_dump_all(HOOK_STAGES, sort_keys=False))
    return [*files, hooks]


def start_kwok(cluster: TestCluster) -> None:
    pki = cluster.root / "pki"
    configs = [f"--config={path}" for path in stage_files(cluster)]
    _start(
        cluster,
        "kwok",
        [
            str(cluster.bin_dir / "kwok"),
            f"--kubeconfig={cluster.kubeconfig}",
            *configs,
            f"--manage-nodes-with-label-selector={SIMULATED_LABEL}=true",
            "--node-ip=127.0.0.1",
            f"--node-port={cluster.kwok_port}",
            f"--server-address=127.0.0.1:{cluster.kwok_port}",
            f"--tls-cert-file={pki / 'kwok.crt'}",
            f"--tls-private-key-file={pki / 'kwok.key'}",
            "--enable-crds=Logs,ClusterLogs",
            "--node-lease-duration-seconds=40",
        ],
    )


def create_simulated_cluster(cluster: TestCluster, config_path: Path) -> list[str]:
    """POST nodes (server-side apply would drop the status capacity) and wait for them Ready."""
    objects = simulated_objects(config_path)
    cluster.kubectl("create", "-f", "-", stdin=yaml.safe_dump_all(objects))
    nodes = [o["metadata"]["name"] for o in objects if o["kind"] == "Node"]
    for node in nodes:
        gpus = cluster.kubectl(
            "get", "node", node, "-o", "jsonpath={.status.capacity.nvidia\\.com/gpu}"
        )
        if not gpus:
            status = next(o["status"] for o in objects if o["metadata"]["name"] == node)
            cluster.kubectl(
                "patch",
                "node",
                node,
                "--subresource=status",
                "--type=merge",
                "-p",
                json.dumps({"status": status}),
            )

    def all_ready() -> bool:
        out = cluster.kubectl(
            "get",
            "nodes",
            "-l",
            f"{SIMULATED_LABEL}=true",
            "-o",
            'jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\\n"}{end}',
        )
        return out.split() == ["True"] * len(nodes)

    _wait("simulated nodes Ready", all_ready, cluster, 60)
    return nodes


def up(
    config_path: Path | None = None, bin_dir: Path | None = None, root: Path | None = None
) -> TestCluster:
    """Start the control plane and the simulated nodes; on failure, stop what was started."""
    bin_dir = bin_dir or find_bin_dir()
    root = root or Path(tempfile.mkdtemp(prefix="kimideploy-testcluster-"))
    (root / "logs").mkdir(parents=True, exist_ok=True)
    cluster = TestCluster(
        root=root,
        bin_dir=bin_dir,
        kubeconfig=root / "kubeconfig",
        api_port=free_port(),
        kwok_port=free_port(),
        token=secrets.token_hex(24),
        restricted_token=secrets.token_hex(24),
    )
    cluster.save()
    try:
        make_pki(root / "pki")
        write_kubeconfig(
            cluster.kubeconfig, root / "pki" / "ca.crt", cluster.api_port, cluster.token
        )
        start_apiserver(cluster, start_etcd(cluster))
        cluster.kubectl("apply", "--server-side", "-f", str(bin_dir / "kwok-crds"))
        for shipped in ("priorityclasses.yaml", "rbac.yaml"):  # what users apply from k8s/base
            cluster.kubectl("apply", "--server-side", "-f", str(REPO / "k8s" / "base" / shipped))
        start_controllers(cluster)
        start_kwok(cluster)
        create_simulated_cluster(cluster, config_path or REPO / "kimideploy.yaml")
    except BaseException:
        down(root, keep_logs=True)
        raise
    return cluster


def down(root: Path, keep_logs: bool = False) -> None:
    """Stop the recorded processes (reverse start order) and remove the directory."""
    state = root / "state.json"
    if state.is_file():
        cluster = TestCluster.load(root)
        for pid in reversed(cluster.pids):
            _stop(pid)
    if keep_logs:
        print(f"logs kept in {root / 'logs'}", file=sys.stderr)
    else:
        shutil.rmtree(root, ignore_errors=True)


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


def write_container_log(path: Path, lines: list[str], stream: str = "stdout") -> Path:
    """Write lines in the CRI container-log format KWOK serves (`<time> <stream> F <line>`)."""
    stamp = "2026-01-01T00:00:00.000000000Z"
    path.write_text("".join(f"{stamp} {stream} F {line}\n" for line in lines))
    return path


def write_timed_container_log(path: Path, lines: list[str], stream: str = "stdout") -> Path:
    """The same from lines that start with their own RFC 3339 time (as `kubectl logs
    --timestamps` prints them): KWOK serves each with that time."""
    entries = []
    for line in lines:
        stamp, _, text = line.partition(" ")
        entries.append(f"{stamp} {stream} F {text}\n")
    path.write_text("".join(entries))
    return path


def serve_logs(
    cluster: TestCluster, namespace: str, log_file: Path, pods: list[str] | None = None
) -> None:
    """Make KWOK serve log_file as the log of every container of the namespace's (named) pods."""
    selector: dict[str, Any] = {"matchNamespaces": [namespace]}
    if pods:
        selector["matchNames"] = pods
    name = f"logs-{namespace}-{secrets.token_hex(3)}"
    logs = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "ClusterLogs",
        "metadata": {"name": name},
        "spec": {"selector": selector, "logs": [{"containers": [], "logsFile": str(log_file)}]},
    }
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(logs))


PodChoice = tuple[Path | None, dict[str, str]]
"""For one new pod: the log file KWOK should serve for it, and annotations to add to it."""


class PodHooks(threading.Thread):
    """While active, give each new pod matching `selector` its own log and annotations.

    A run's pods are named by the Job controller, so a test cannot name them in advance; this
    decides per pod from its labels (e.g. the drafter a bench pod measures)."""

    def __init__(
        self,
        cluster: TestCluster,
        namespace: str,
        selector: str,
        choose: Callable[[dict[str, Any]], PodChoice],
    ) -> None:
        super().__init__(daemon=True)
        self.cluster, self.namespace, self.selector, self.choose = (
            cluster,
            namespace,
            selector,
            choose,
        )
        self.seen: set[str] = set()
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            listed = self.cluster.kubectl(
                "-n", self.namespace, "get", "pods", "-l", self.selector, "-o", "json", check=False
            )
            for pod in json.loads(listed or '{"items": []}')["items"]:
                name = pod["metadata"]["name"]
                if name in self.seen:
                    continue
                self.seen.add(name)
                log_file, annotations = self.choose(pod)
                if log_file is not None:
                    logs = {
                        "apiVersion": "kwok.x-k8s.io/v1alpha1",
                        "kind": "Logs",
                        "metadata": {"name": name, "namespace": self.namespace},
                        "spec": {"logs": [{"containers": [], "logsFile": str(log_file)}]},
                    }
                    self.cluster.kubectl(
                        "apply", "-f", "-", stdin=yaml.safe_dump(logs), check=False
                    )
                # Its log is in place: a pod that awaits the hook may now run to its end.
                pairs = [f"{k}={v}" for k, v in annotations.items()]
                if AWAIT_HOOK in (pod["metadata"].get("annotations") or {}):
                    pairs.append(f"{AWAIT_HOOK}-")
                if pairs:
                    self.cluster.kubectl(
                        "-n",
                        self.namespace,
                        "annotate",
                        "--overwrite",
                        "pod",
                        name,
                        *pairs,
                        check=False,
                    )
            self.stopping.wait(0.2)

    def __enter__(self) -> PodHooks:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.join(timeout=10)


def main(argv: list[str]) -> int:
    """`up [CONFIG]` prints exports (KUBECONFIG last); `down [DIR]` stops a cluster."""
    if argv[:1] == ["up"]:
        start = time.monotonic()
        config = Path(argv[1]) if len(argv) > 1 else None
        try:
            cluster = up(config)
        except HarnessError as exc:
            print(f"testcluster: {exc}", file=sys.stderr)
            return 1
        elapsed = time.monotonic() - start
        print(f"# test control plane ready in {elapsed:.1f}s; logs in {cluster.root / 'logs'}")
        print(f"export KIMIDEPLOY_TESTCLUSTER={cluster.root}")
        print(f"export KUBECONFIG={cluster.kubeconfig}")
        return 0
    if argv[:1] == ["down"]:
        target = argv[1] if len(argv) > 1 else os.environ.get("KIMIDEPLOY_TESTCLUSTER")
        if not target or not (Path(target) / "state.json").is_file():
            print(
                "testcluster: give the directory `up` printed, or set KIMIDEPLOY_TESTCLUSTER",
                file=sys.stderr,
            )
            return 2
        down(Path(target))
        return 0
    print("usage: harness.py up [CONFIG] | down [DIR]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
