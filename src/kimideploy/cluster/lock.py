"""A Lease per release so that two `up`/`rollback`/`down` runs never interleave.

Times come from the API server's clock (its Date header), never this machine's: the Lease's
acquire and renew times are written in it, and expiry is judged against it, so a CLI whose clock
runs 10 minutes ahead does not take over a Lease another run renewed a second ago. A Lease whose
times cannot be read is a named problem, not a guess.

Fenced: `renew()` is called before every change a run makes and checks that the Lease still
names this run as holder, updating it under the resourceVersion it read. A run whose Lease
expired (a confirmation left waiting, a suspended laptop) and was taken over learns that before
its next write, instead of deleting or overwriting what the new holder applied.
"""

from __future__ import annotations

import getpass
import os
import socket
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from kimideploy.cluster.api import ConflictError, KubeApi, NotFoundError
from kimideploy.cluster.resources import path
from kimideploy.errors import ClusterError, KimiDeployError

LEASE_SECONDS = 120


class ReleaseLockedError(KimiDeployError):
    """Another kimideploy run holds the release's lock."""


class LockLostError(ClusterError):
    """The lock this run held was taken over or removed; the run stops before its next write."""


def holder_identity(action: str) -> str:
    return f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()} ({action})"


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(stamp: Any) -> datetime | None:
    """A Lease's MicroTime, or None when it is missing or not one."""
    if not isinstance(stamp, str):
        return None
    for layout in ("%Y-%m-%dT%H:%M:%S.%f%z", "%Y-%m-%dT%H:%M:%S%z"):
        try:
            return datetime.strptime(stamp.replace("Z", "+0000"), layout)
        except ValueError:
            continue
    return None


class ReleaseLock:
    """`with ReleaseLock(api, ns, release, action):` holds the Lease, renewing on `renew()`."""

    def __init__(self, api: KubeApi, namespace: str, release: str, action: str) -> None:
        self.api, self.namespace, self.release = api, namespace, release
        self.name = f"kimideploy-lock-{release}"
        self.identity = holder_identity(action)

    def _body(self, resource_version: str | None = None) -> dict[str, Any]:
        now = _stamp(self.api.server_time())
        metadata: dict[str, Any] = {
            "name": self.name,
            "namespace": self.namespace,
            "labels": {"app.kubernetes.io/managed-by": "kimideploy"},
        }
        if resource_version:
            metadata["resourceVersion"] = resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": LEASE_SECONDS,
                "acquireTime": now,
                "renewTime": now,
            },
        }

    def _lease_path(self) -> str:
        return path("Lease", self.namespace, self.name)

    def acquire(self) -> None:
        try:
            self.api.request("POST", path("Lease", self.namespace), body=self._body())
            return
        except ConflictError:
            pass
        live = self.api.request("GET", self._lease_path())
        spec = live.get("spec") if isinstance(live.get("spec"), dict) else {}
        renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
        duration = spec.get("leaseDurationSeconds", LEASE_SECONDS)
        if renewed is None or not isinstance(duration, int) or isinstance(duration, bool):
            raise ReleaseLockedError(
                f"release {self.release}'s lock (Lease {self.name}) is malformed: renewTime "
                f"{spec.get('renewTime')!r}, acquireTime {spec.get('acquireTime')!r}, "
                f"leaseDurationSeconds {spec.get('leaseDurationSeconds')!r}; it was not taken over",
                hint=f"if no kimideploy run is active, delete it: kubectl -n {self.namespace} "
                f"delete lease {self.name}",
            )
        expires = renewed + timedelta(seconds=duration)
        if expires > self.api.server_time() and spec.get("holderIdentity") != self.identity:
            raise ReleaseLockedError(
                f"release {self.release} is locked by {spec.get('holderIdentity')} "
                f"(since {spec.get('acquireTime')}, expires {_stamp(expires)} unless renewed)",
                hint="wait for that run to finish; a crashed run's lock expires by itself "
                f"within {LEASE_SECONDS}s",
            )
        try:  # expired: take it over, guarded by the resourceVersion we read
            body = self._body(live["metadata"]["resourceVersion"])
            self.api.request("PUT", self._lease_path(), body=body)
        except ConflictError as exc:
            raise ReleaseLockedError(
                f"release {self.release} was just locked by another run"
            ) from exc

    def _lost(self, why: str) -> LockLostError:
        return LockLostError(
            f"the lock on release {self.release} was {why} while this run held it; this run "
            "stopped before its next change so as not to undo the other run's",
            hint=f"`kimideploy history` shows what the other run did; run this command again "
            f"once it has finished (a lock left idle expires after {LEASE_SECONDS}s)",
        )

    def renew(self) -> None:
        """The fence: confirm this run still holds the Lease, and extend it."""
        try:
            live = self.api.request("GET", self._lease_path())
        except NotFoundError:
            raise self._lost("removed (it had expired)") from None
        spec = live.get("spec", {})
        holder = spec.get("holderIdentity")
        if holder != self.identity:
            raise self._lost(f"taken over by {holder} at {spec.get('acquireTime')}")
        spec["renewTime"] = _stamp(self.api.server_time())
        try:  # the PUT carries the resourceVersion read above: a takeover in between conflicts
            self.api.request("PUT", self._lease_path(), body=live)
        except (ConflictError, NotFoundError):
            raise self._lost("taken over") from None

    def release_lock(self) -> None:
        """Delete the Lease only if it is still ours, exactly as read (a precondition)."""
        try:
            live = self.api.request("GET", self._lease_path())
            if live.get("spec", {}).get("holderIdentity") != self.identity:
                return
            preconditions = {"resourceVersion": live["metadata"]["resourceVersion"]}
            self.api.request("DELETE", self._lease_path(), body={"preconditions": preconditions})
        except (NotFoundError, ConflictError):
            pass

    def __enter__(self) -> ReleaseLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release_lock()
