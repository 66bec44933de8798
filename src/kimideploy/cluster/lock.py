"""A Lease per release so that two `up`/`rollback` runs never interleave."""

from __future__ import annotations

import getpass
import os
import socket
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any

from kimideploy.cluster.api import ConflictError, KubeApi, NotFoundError
from kimideploy.cluster.resources import path
from kimideploy.errors import KimiDeployError

LEASE_SECONDS = 120


class ReleaseLockedError(KimiDeployError):
    """Another kimideploy run holds the release's lock."""


def holder_identity(action: str) -> str:
    return f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()} ({action})"


def _now() -> datetime:
    return datetime.now(UTC)


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(stamp: str) -> datetime:
    return datetime.strptime(stamp.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")


class ReleaseLock:
    """`with ReleaseLock(api, ns, release, action):` holds the Lease, renewing on `renew()`."""

    def __init__(self, api: KubeApi, namespace: str, release: str, action: str) -> None:
        self.api, self.namespace, self.release = api, namespace, release
        self.name = f"kimideploy-lock-{release}"
        self.identity = holder_identity(action)

    def _body(self, resource_version: str | None = None) -> dict[str, Any]:
        now = _stamp(_now())
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

    def acquire(self) -> None:
        try:
            self.api.request("POST", path("Lease", self.namespace), body=self._body())
            return
        except ConflictError:
            pass
        live = self.api.request("GET", path("Lease", self.namespace, self.name))
        spec = live.get("spec", {})
        renewed = _parse(spec.get("renewTime") or spec.get("acquireTime"))
        expires = renewed + timedelta(seconds=spec.get("leaseDurationSeconds", LEASE_SECONDS))
        if expires > _now() and spec.get("holderIdentity") != self.identity:
            raise ReleaseLockedError(
                f"release {self.release} is locked by {spec.get('holderIdentity')} "
                f"(since {spec.get('acquireTime')}, expires {_stamp(expires)} unless renewed)",
                hint="wait for that run to finish; a crashed run's lock expires by itself "
                f"within {LEASE_SECONDS}s",
            )
        try:  # expired: take it over, guarded by the resourceVersion we read
            body = self._body(live["metadata"]["resourceVersion"])
            self.api.request("PUT", path("Lease", self.namespace, self.name), body=body)
        except ConflictError as exc:
            raise ReleaseLockedError(
                f"release {self.release} was just locked by another run"
            ) from exc

    def renew(self) -> None:
        try:
            live = self.api.request("GET", path("Lease", self.namespace, self.name))
        except NotFoundError:
            return
        live["spec"]["renewTime"] = _stamp(_now())
        self.api.request("PUT", path("Lease", self.namespace, self.name), body=live)

    def release_lock(self) -> None:
        try:
            live = self.api.request("GET", path("Lease", self.namespace, self.name))
            if live.get("spec", {}).get("holderIdentity") == self.identity:
                self.api.request("DELETE", path("Lease", self.namespace, self.name))
        except NotFoundError:
            pass

    def __enter__(self) -> ReleaseLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release_lock()
