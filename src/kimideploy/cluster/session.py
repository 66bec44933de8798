"""ClusterSession: what the services may do to one namespace of one cluster.

The services receive a session instead of importing this package's modules, so the CLI decides
which cluster (context, namespace) and tests can pass their own.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kimideploy.cluster import apply as applying
from kimideploy.cluster import bench_results, calibrations, jobs, measurements, records
from kimideploy.cluster import pods as pod_reads
from kimideploy.cluster.api import ConflictError, KubeApi, NotFoundError
from kimideploy.cluster.lock import ReleaseLock
from kimideploy.cluster.record_trust import RouteParent
from kimideploy.cluster.resources import KUEUE_VERSIONS, path
from kimideploy.cluster.rollout import RolloutWatcher
from kimideploy.errors import ClusterError, UsageError
from kimideploy.plan.calibration import Calibration
from kimideploy.plan.model import ClusterAnswers
from kimideploy.plan.stage_estimate import MeasuredRate

RATES = "rates"
"""The measurement kind finished runs record their rates under (services/runs/run_rates.py)."""
MONITORING_API = "monitoring.coreos.com/v1"
"""The Prometheus Operator's API: a serve plan renders a PodMonitor where it is served."""


@dataclass
class ClusterSession:
    api: KubeApi
    namespace: str
    ignored_records: dict[str, list[records.UntrustedRecordError]] = field(default_factory=dict)
    """Per release, the stored records the last history read refused (never acted on)."""
    ignored_bench_results: dict[str, list[str]] = field(default_factory=dict)
    """Per release, the stored bench results the last read did not believe, and why."""
    cluster: str = ""
    """The cluster profile this session was opened for, decided once per command
    (services/connection.open_session); empty when opened without one."""
    keep_calibrations: Callable[[tuple[Calibration, ...]], None] | None = None
    """Called with the calibrations `answers` read (the CLI keeps a local copy for offline use)."""
    route_parent: RouteParent | None = None
    """The cluster profile's gateway listener: the only parent a stored HTTPRoute may name
    (cluster/record_trust.py); None where the profile serves through no gateway."""

    @functools.cached_property
    def answers(self) -> ClusterAnswers:
        """What this cluster answers every plan of the command: where it works, whether it
        serves PodMonitors, its stored calibrations. Asked once, when a plan first needs it."""
        found = self.calibrations_of(self.cluster) if self.cluster else ()
        if self.keep_calibrations is not None:
            self.keep_calibrations(found)
        return ClusterAnswers(
            namespace=self.namespace,
            monitoring_crd=self.has_api_resource(MONITORING_API, "podmonitors"),
            calibrations=found,
            storage_read_gbps=self.storage_read_gbps(),
            rates=self.run_rates(),
        )

    def run_rates(self) -> tuple[MeasuredRate, ...]:
        """What finished runs measured on this cluster (plan/estimates.py), oldest first;
        entries of the wrong shape are left out (the store is a ConfigMap)."""
        if not self.cluster:
            return ()
        try:
            found = self.measurements(RATES)
        except ClusterError:
            return ()
        return tuple(r for r in map(MeasuredRate.from_dict, found) if r is not None)

    def storage_read_gbps(self) -> float | None:
        """The newest storage probe's read bandwidth of this cluster's models claim (GB/s)."""
        if not self.cluster:
            return None
        try:
            found = self.measurements("storage")
        except ClusterError:
            return None
        gbps = found[-1].get("gbps") if found else None
        return float(gbps) if isinstance(gbps, int | float) else None

    def measurements(self, kind: str) -> list[dict[str, Any]]:
        """What was measured of `kind` on this session's cluster, oldest first."""
        return measurements.read(self.api, self.namespace, self.cluster, kind)

    def record_measurement(self, kind: str, entry: dict[str, Any]) -> None:
        measurements.record(self.api, self.namespace, self.cluster, kind, entry)

    # namespaces -----------------------------------------------------------------------------
    def namespace_exists(self) -> bool:
        try:
            self.api.request("GET", path("Namespace", None, self.namespace))
            return True
        except NotFoundError:
            return False

    def ensure_namespace(self) -> bool:
        """Create the namespace when missing; True if it was created."""
        if self.namespace_exists():
            return False
        body = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": self.namespace,
                "labels": {"app.kubernetes.io/managed-by": "kimideploy"},
            },
        }
        try:
            self.api.request("POST", path("Namespace"), body=body)
        except ConflictError:
            return False
        except ClusterError as exc:
            raise ClusterError(
                f"namespace {self.namespace} does not exist and cannot be created: {exc.message}",
                hint=f"ask a cluster admin to run `kubectl create namespace {self.namespace}`",
            ) from exc
        return True

    def require_namespace(self) -> None:
        """For a server dry run, which must create nothing, not even the namespace."""
        if not self.namespace_exists():
            raise UsageError(
                f"namespace {self.namespace} does not exist",
                hint="`kimideploy up` and `kimideploy run` create it, or pass --namespace NAME",
            )

    # objects --------------------------------------------------------------------------------
    def apply(self, objects: list[dict[str, Any]], force: bool = False) -> list[applying.ObjectRef]:
        return applying.apply_all(self.api, objects, force=force)

    def create(self, obj: dict[str, Any]) -> bool:
        """Create an object that must never be overwritten (a Secret's value): False when one of
        that name exists already (it is left as it is)."""
        target = applying.ref(obj)
        try:
            self.api.request("POST", path(target.kind, target.namespace or None), body=obj)
        except ConflictError:
            return False
        return True

    def validate(self, objects: list[dict[str, Any]], force: bool = False) -> None:
        applying.validate_all(self.api, objects, force=force)

    def keep_claim_sizes(
        self, objects: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[str]]:
        return applying.never_shrink_claims(self.api, objects)

    def dry_run_diff(self, objects: list[dict[str, Any]], force: bool = False) -> str:
        return applying.diff(self.api, objects, force=force)

    def prune(self, release: str, keep: list[applying.ObjectRef]) -> list[applying.ObjectRef]:
        return applying.prune(self.api, self.namespace, release, keep)

    def live_release_objects(self, release: str) -> list[dict[str, Any]]:
        return applying.live_release_objects(self.api, self.namespace, release)

    def delete(self, target: applying.ObjectRef) -> bool:
        return applying.delete_object(self.api, target)

    def wait_gone(self, targets: list[applying.ObjectRef], timeout_s: float = 300) -> list[str]:
        """Wait until deleted objects (and a Deployment's pods) are gone; returns what remains."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = [str(t) for t in targets if applying.get_live(self.api, t) is not None]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)

    def adopt(self, owner_kind: str, owner: str, parts: list[tuple[str, str]]) -> None:
        """Make `owner` the controller of each part, so Kubernetes' garbage collector deletes
        them with it."""
        live = self.get(owner_kind, owner)
        if live is None:
            return
        reference = {
            "apiVersion": live["apiVersion"],
            "kind": owner_kind,
            "name": owner,
            "uid": live["metadata"]["uid"],
            "blockOwnerDeletion": False,
        }
        for kind, name in parts:
            self.api.request(
                "PATCH",
                path(kind, self.namespace, name),
                body={"metadata": {"ownerReferences": [reference]}},
                content_type="application/merge-patch+json",
            )

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        return applying.get_live(self.api, applying.ObjectRef(kind, self.namespace, name))

    def missing_cluster_objects(self, kind: str, names: list[str]) -> list[str]:
        """Which of the named cluster-scoped objects (PriorityClasses) do not exist."""
        return [
            name
            for name in names
            if applying.get_live(self.api, applying.ObjectRef(kind, "", name)) is None
        ]

    def secret_keys(self, name: str) -> list[str] | None:
        """The keys of a Secret in this namespace (never its values), None if it is missing."""
        live = self.get("Secret", name)
        return None if live is None else sorted((live.get("data") or {}).keys())

    def node_resources(self) -> dict[str, int] | None:
        """The most of each extended resource (nvidia.com/gpu, an RDMA device plugin's) one
        node offers as allocatable, or None where this context may not list nodes."""
        try:
            listed = self.api.request("GET", "/api/v1/nodes")
        except ClusterError as exc:
            if exc.message.startswith("forbidden"):
                return None
            raise
        most: dict[str, int] = {}
        for node in listed.get("items", []):
            for name, quantity in ((node.get("status") or {}).get("allocatable") or {}).items():
                if "/" in name and str(quantity).isdigit():
                    most[name] = max(most.get(name, 0), int(quantity))
        return most

    def list_claims(self) -> list[str]:
        listed = self.api.request("GET", path("PersistentVolumeClaim", self.namespace))
        return [item["metadata"]["name"] for item in listed.get("items", [])]

    def server_time(self) -> datetime:
        """The API server's clock: stored times are written and judged in it."""
        return self.api.server_time()

    # history and locking --------------------------------------------------------------------
    def history(self, release: str) -> list[records.ReleaseRecord]:
        """The release's trusted records; those that failed the trust checks are kept in
        `ignored_records` for the commands that show history to report."""
        found, refused = records.read_history(self.api, self.namespace, release, self.route_parent)
        self.ignored_records[release] = refused
        return found

    def record(self, record: records.ReleaseRecord, new: bool) -> None:
        (records.create if new else records.update)(self.api, record)

    def trim_history(self, release: str, keep: int) -> list[int]:
        return records.trim(self.api, self.namespace, release, keep, self.route_parent)

    def lock(self, release: str, action: str) -> ReleaseLock:
        return ReleaseLock(self.api, self.namespace, release, action)

    # bench results ----------------------------------------------------------------------------
    def store_bench(self, bench: bench_results.StoredBench) -> None:
        bench_results.store(self.api, self.namespace, bench)

    def bench_results(self, release: str) -> list[bench_results.StoredBench]:
        found, refused = bench_results.read_results(self.api, self.namespace, release)
        self.ignored_bench_results[release] = refused
        return found

    def store_calibration(self, calibration_id: str, calibration: Calibration) -> None:
        calibrations.store(self.api, self.namespace, calibration_id, calibration)

    def calibrations(self, cluster: str) -> list[tuple[str, Calibration]]:
        return calibrations.list_calibrations(self.api, self.namespace, cluster)

    def calibrations_of(self, cluster: str) -> tuple[Calibration, ...]:
        """The ones with measured levels, oldest first; none when they cannot be read (a
        prediction then falls back to the default constant and says so)."""
        try:
            return tuple(c for _, c in self.calibrations(cluster) if c.points)
        except ClusterError:
            return ()

    # watching -------------------------------------------------------------------------------
    def rollout_watcher(
        self, deployment: str, startup_budget_s: float, grace_s: float
    ) -> RolloutWatcher:
        return RolloutWatcher(self.api, self.namespace, deployment, startup_budget_s, grace_s)

    def job(self, name: str, with_logs: bool = True) -> jobs.JobSnapshot:
        return jobs.job_snapshot(self.api, self.namespace, name, with_logs)

    def runs(self, selector: str) -> list[dict[str, Any]]:
        return jobs.list_runs(self.api, self.namespace, selector)

    def pods(self, selector: str) -> list[dict[str, Any]]:
        return pod_reads.list_pods(self.api, self.namespace, selector)

    def log(
        self,
        pod: str,
        tail: int | None = None,
        container: str | None = None,
        *,
        timestamps: bool = False,
    ) -> str:
        return pod_reads.pod_log(
            self.api, self.namespace, pod, tail=tail, container=container, timestamps=timestamps
        )

    def follow(self, pod: str) -> Any:
        return pod_reads.follow_log(self.api, self.namespace, pod)

    def scrape_pod(self, pod: str, port: int, endpoint: str = "metrics") -> str:
        """GET a pod's HTTP endpoint through the API server's pod proxy (no port-forward needed).

        Raises ClusterError when the proxy cannot reach the pod (no route, not listening)."""
        try:
            return self.api.text(
                path("Pod", self.namespace, f"{pod}:{port}", f"proxy/{endpoint}"), timeout=10
            )
        except ClusterError as exc:
            raise ClusterError(
                f"the API server's proxy to {pod}:{port}/{endpoint} failed ({exc.message})"
            ) from exc

    def local_queue_version(self) -> str | None:
        """The newest kueue.x-k8s.io version serving localqueues; None: Kueue is not installed."""
        return next(
            (
                v
                for v in KUEUE_VERSIONS
                if self.has_api_resource(f"kueue.x-k8s.io/{v}", "localqueues")
            ),
            None,
        )

    def local_queue(self, name: str, version: str) -> dict[str, Any] | None:
        where = path("LocalQueue", self.namespace, name, version=version)
        try:
            found: dict[str, Any] = self.api.request("GET", where)
        except NotFoundError:
            return None
        return found

    def has_api_resource(self, group_version: str, plural: str) -> bool:
        """Whether the cluster serves a resource (a CRD such as monitoring.coreos.com/v1)."""
        try:
            listed = self.api.request("GET", f"/apis/{group_version}")
        except NotFoundError:
            return False
        return any(r.get("name") == plural for r in listed.get("resources", []))


def connect(
    context: str | None,
    namespace: str,
    cluster: str = "",
    keep_calibrations: Callable[[tuple[Calibration, ...]], None] | None = None,
    *,
    route_parent: RouteParent | None = None,
) -> ClusterSession:
    """A session on KUBECONFIG's `context` (or the current one), checked with one cheap request."""
    api = KubeApi(context=context)
    api.request("GET", "/version", timeout=10)  # unreachable or unauthenticated fails here
    return ClusterSession(
        api=api,
        namespace=namespace,
        cluster=cluster,
        keep_calibrations=keep_calibrations,
        route_parent=route_parent,
    )
