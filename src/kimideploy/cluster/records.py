"""Release history in the cluster: one Secret per revision, gzip-compressed JSON.

Stored in the release's namespace, so anyone with the same kubeconfig sees the same history, and
it survives the machine that ran the CLI. Secrets (not ConfigMaps) because the record holds the
rendered manifests and config, which may be sensitive, and RBAC usually guards Secrets more.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from kimideploy.cluster import record_trust
from kimideploy.cluster.api import ConflictError, KubeApi, NotFoundError
from kimideploy.cluster.resources import path
from kimideploy.errors import ClusterError, UsageError

RECORD_TYPE = "kimideploy.io/release.v1"
RECORD_LABEL = "kimideploy.io/release-record"
REVISION_LABEL = "kimideploy.io/revision"
STATUS_LABEL = "kimideploy.io/status"
DRAFTER_LABEL = "kimideploy.io/drafter"
GATE_LABEL = "kimideploy.io/gate"
GATE_SPEEDUP_LABEL = "kimideploy.io/gate-speedup"
"""Labels, so kube-state-metrics (kube_secret_labels) can chart gate verdicts in Grafana."""
DEFAULT_KEEP = 10

SCHEMA = "1.2"
"""Record layout, major.minor. A newer minor only adds fields (this reader ignores what it does
not know); a newer major changed the meaning of one, and this reader refuses it."""


@dataclass
class ReleaseRecord:
    release: str
    revision: int
    status: str
    created_at: str
    user: str
    cluster: str
    namespace: str
    drafter: str
    image: str
    config_sha256: str
    config_text: str
    overrides: list[str]
    manifests: list[dict[str, Any]]
    note: str = ""
    source_revision: int | None = None
    details: dict[str, Any] = field(default_factory=dict)
    workload: str = "serve"
    """The workload whose release this is (records before schema 1.2: serve, the only one)."""
    schema: str = SCHEMA
    resource_version: str | None = field(default=None, compare=False, metadata={"stored": False})
    """The Secret's resourceVersion when read or written: updates are conditional on it, so a
    record changed by another writer since is never overwritten."""


def secret_name(release: str, revision: int) -> str:
    return f"kimideploy.release.{release}.v{revision}"


def _encode(record: ReleaseRecord) -> str:
    """Secret data is base64 of the value; the value is gzip-compressed JSON."""
    stored = {f.name for f in fields(ReleaseRecord) if f.metadata.get("stored", True)}
    data = {key: value for key, value in asdict(record).items() if key in stored}
    raw = json.dumps(data, sort_keys=True).encode()
    return base64.b64encode(gzip.compress(raw, mtime=0)).decode()


class UntrustedRecordError(UsageError):
    """A stored record failed the trust checks (cluster/record_trust.py): never applied."""


def _decode(
    secret: dict[str, Any],
    namespace: str,
    release: str,
    route_parent: record_trust.RouteParent | None = None,
) -> ReleaseRecord:
    """The record a Secret holds, if it is one kimideploy may act on for `release` in
    `namespace`; otherwise UntrustedRecordError naming the Secret and every problem."""
    meta = record_trust.mapping(secret.get("metadata"))
    name = str(meta.get("name", "a release record"))
    try:
        raw = record_trust.decompress(record_trust.mapping(secret.get("data")).get("release"), name)
        data = record_trust.parse(raw, name)
    except record_trust.RecordTrustError as exc:
        raise UntrustedRecordError(str(exc), hint=UNTRUSTED_HINT) from exc
    found = str(data.get("schema", "1.0"))  # records before the field existed are 1.0
    major = found.split(".")[0]
    if major.isdigit() and int(major) > int(SCHEMA.split(".")[0]):
        raise UsageError(
            f"{name} was written by a newer kimideploy (record schema {found}; this one reads "
            f"{SCHEMA.split('.')[0]}.x), so its history cannot be read safely here",
            hint="upgrade kimideploy to the version that wrote it (pip install -U kimideploy)",
        )
    labels = record_trust.mapping(meta.get("labels"))
    wrong = record_trust.problems(data, name, labels, namespace, release, route_parent=route_parent)
    if wrong:
        raise UntrustedRecordError(f"{name}: " + "; ".join(wrong[:8]), hint=UNTRUSTED_HINT)
    known = {f.name for f in fields(ReleaseRecord) if f.metadata.get("stored", True)}
    record = ReleaseRecord(**{key: value for key, value in data.items() if key in known})
    record.resource_version = meta.get("resourceVersion")
    return record


UNTRUSTED_HINT = (
    "kimideploy wrote no such record: someone with write access to Secrets in this namespace "
    "did, or it was damaged; it is ignored and never applied. Delete it once you have looked "
    "(kubectl delete secret NAME)"
)


def _labels(record: ReleaseRecord) -> dict[str, str]:
    labels = {
        RECORD_LABEL: record.release,
        REVISION_LABEL: str(record.revision),
        STATUS_LABEL: record.status,
        DRAFTER_LABEL: record.drafter,
        "app.kubernetes.io/managed-by": "kimideploy",
    }
    gate = record.details.get("gate")
    if gate:
        labels[GATE_LABEL] = "fail-open" if gate.get("fail_open") else str(gate["decision"])
        if gate.get("worst_speedup") is not None:
            labels[GATE_SPEEDUP_LABEL] = f"{gate['worst_speedup']:.3f}"
    return labels


def _secret(record: ReleaseRecord) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": RECORD_TYPE,
        "metadata": {
            "name": secret_name(record.release, record.revision),
            "namespace": record.namespace,
            "labels": _labels(record),
        },
        "data": {"release": _encode(record)},
    }


class RecordChangedError(ClusterError):
    """A release record changed (or appeared) since this run read the history."""


def create(api: KubeApi, record: ReleaseRecord) -> None:
    """Store a new revision; a concurrent writer of the same revision makes this fail loudly."""
    try:
        stored = api.request("POST", path("Secret", record.namespace), body=_secret(record))
    except ConflictError as exc:
        raise RecordChangedError(
            f"revision {record.revision} of {record.release} was created by another run "
            "since this one read the history; nothing was applied",
            hint="`kimideploy history` shows it; run the command again",
        ) from exc
    record.resource_version = stored["metadata"]["resourceVersion"]


def update(api: KubeApi, record: ReleaseRecord) -> None:
    """Rewrite a record as read: the resourceVersion is a precondition of the update."""
    body = _secret(record)
    if record.resource_version is None:
        raise ValueError(f"record {body['metadata']['name']} was never read or written")
    body["metadata"]["resourceVersion"] = record.resource_version
    try:
        stored = api.request(
            "PUT", path("Secret", record.namespace, body["metadata"]["name"]), body=body
        )
    except (ConflictError, NotFoundError) as exc:
        raise RecordChangedError(
            f"release record {body['metadata']['name']} (revision {record.revision}) was "
            "changed or removed by another writer since this run read it; it was not overwritten",
            hint="`kimideploy history` shows its current state; run the command again",
        ) from exc
    record.resource_version = stored["metadata"]["resourceVersion"]


def read_history(
    api: KubeApi,
    namespace: str,
    release: str,
    route_parent: record_trust.RouteParent | None = None,
) -> tuple[list[ReleaseRecord], list[UntrustedRecordError]]:
    """Every stored revision that passes the trust checks, oldest first, and why the others
    did not (they are never acted on)."""
    listed = api.request(
        "GET", path("Secret", namespace), {"labelSelector": f"{RECORD_LABEL}={release}"}
    )
    records, refused = [], []
    for item in listed.get("items", []):
        if item.get("type") != RECORD_TYPE:
            continue
        try:
            records.append(_decode(item, namespace, release, route_parent))
        except UntrustedRecordError as exc:
            refused.append(exc)
    return sorted(records, key=lambda r: r.revision), refused


def history(
    api: KubeApi,
    namespace: str,
    release: str,
    route_parent: record_trust.RouteParent | None = None,
) -> list[ReleaseRecord]:
    """Every trusted stored revision, oldest first."""
    return read_history(api, namespace, release, route_parent)[0]


def get(api: KubeApi, namespace: str, release: str, revision: int) -> ReleaseRecord:
    try:
        secret = api.request("GET", path("Secret", namespace, secret_name(release, revision)))
    except NotFoundError as exc:
        raise KeyError(revision) from exc
    return _decode(secret, namespace, release)


def trim(
    api: KubeApi,
    namespace: str,
    release: str,
    keep: int = DEFAULT_KEEP,
    route_parent: record_trust.RouteParent | None = None,
) -> list[int]:
    """Delete the oldest records beyond `keep`; returns the revisions removed."""
    records = history(api, namespace, release, route_parent)
    removed = []
    for record in records[: max(0, len(records) - keep)]:
        preconditions = {"resourceVersion": record.resource_version}
        with contextlib.suppress(NotFoundError, ConflictError):  # gone, or rewritten meanwhile
            api.request(
                "DELETE",
                path("Secret", namespace, secret_name(release, record.revision)),
                body={"preconditions": preconditions},
            )
        removed.append(record.revision)
    return removed
