"""`kimideploy prepare`: what a cluster needs before the first `up` or `run`, checked and created.

Every workload kimideploy renders for the cluster is read for what its pods name and the cluster
must already hold: the namespace, the PriorityClasses, and each Secret and key (the hub token,
the registry's push and pull credentials, the serve release's API key). What exists is left
alone (a Secret's value is never read, compared or replaced); what is missing is created where
kimideploy knows the value's source, otherwise named with the command that creates it:

- the API key: a new random token (the serve release and its clients read the Secret);
- the hub token: from $HF_TOKEN in this shell (never printed, never on a command line);
- registry credentials: from a Docker/ORAS auth file (`--registry-auth`, as `docker login` or
  `oras login` writes it; `--registry-pull-auth` for a pull-only one), as a
  kubernetes.io/dockerconfigjson Secret holding only the project registry's host (a user's
  ~/.docker/config.json also holds Docker Hub's and every other registry's, which every holder
  of the deployer role could then read); a credential kept by a helper (credsStore,
  credHelpers) is refused with the helper's name, since no pod can run the helper;
- PriorityClasses: k8s/base/priorityclasses.yaml (cluster-scoped: a cluster admin's right).

`--dry-run` creates nothing and says what it would create. The same checks run again, read-only,
before every `up` and `run` (services/preflight.py); this command is how a newcomer satisfies
them in one step.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kimideploy.cluster.session import ClusterSession
from kimideploy.config.drafters import NO_DRAFTER
from kimideploy.config.loading import LoadedProject
from kimideploy.config.workload_names import PULL, WEIGHTS, WORKLOAD_NAMES
from kimideploy.errors import ClusterError, KimiDeployError, MethodNotServedError, UsageError
from kimideploy.formats.bounded_io import JSON_LIMIT, UnreadableFileError, read_bytes
from kimideploy.paths import repository_root
from kimideploy.plan.model import PlanRequest, pull_ask
from kimideploy.services.rendering import render_workload

DOCKER_CONFIG_KEY = ".dockerconfigjson"
HF_TOKEN_VARIABLE = "HF_TOKEN"
MANAGED = {"app.kubernetes.io/managed-by": "kimideploy"}


@dataclass(frozen=True)
class Prerequisite:
    what: str
    used_by: str
    state: str
    """present, created, would create, missing, or note (nothing to create: what to know)."""
    how: str = ""

    def row(self) -> dict[str, str]:
        return {
            "prerequisite": self.what,
            "for": self.used_by,
            "state": self.state,
            "how": self.how,
        }


@dataclass(frozen=True)
class SecretNeed:
    name: str
    keys: tuple[str, ...]
    used_by: str
    source: str
    """api-key, hub-token, registry, or other."""


@dataclass(frozen=True)
class Needs:
    priority_classes: tuple[str, ...]
    secrets: tuple[SecretNeed, ...]


def cluster_objects(loaded: LoadedProject, cluster: str) -> list[dict[str, Any]]:
    """Every object kimideploy would render for the cluster: each workload (serve with no
    drafter and with each drafter the cluster can serve)."""
    project = loaded.project
    published = tuple(sorted(n for n, d in project.eagle_drafters.items() if d.source.oci))
    objects: list[dict[str, Any]] = []
    for workload in WORKLOAD_NAMES:
        if workload == PULL and not published:
            continue
        if workload == WEIGHTS and project.clusters[cluster].weights_via != "job":
            continue
        drafters = [NO_DRAFTER, *sorted(project.drafters)] if workload == "serve" else [None]
        for drafter in drafters:
            request = PlanRequest(workload, cluster, drafter, ask=pull_ask(workload, published))
            try:
                objects += render_workload(loaded, request).objects
            except (MethodNotServedError, UsageError):
                continue  # what the cluster can never run needs nothing there
    return objects


def needs(loaded: LoadedProject, cluster: str) -> Needs:
    project = loaded.project
    classes: set[str] = set()
    keys: dict[str, set[str]] = {}
    for obj in cluster_objects(loaded, cluster):
        if obj["kind"] not in ("Deployment", "Job"):
            continue
        spec = obj["spec"]["template"]["spec"]
        if spec.get("priorityClassName"):
            classes.add(spec["priorityClassName"])
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            for entry in container.get("env", []):
                ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    keys.setdefault(ref["name"], set()).add(ref["key"])
        for volume in spec.get("volumes", []):
            secret = volume.get("secret")
            if secret:
                found = keys.setdefault(secret["secretName"], set())
                found.update(item["key"] for item in secret.get("items", []))
    registry = project.registry
    roles = {}
    if project.model.hf_token is not None:
        roles[project.model.hf_token.name] = ("hub-token", "model.hf_token")
    if registry is not None:
        roles[registry.push_secret] = ("registry", "registry.push_secret")
        roles[registry.pull_secret] = ("registry", "registry.pull_secret")
    api_key = project.clusters[cluster].workloads.serve.api_key
    if api_key is not None:
        roles[api_key.name] = ("api-key", f"clusters.{cluster}.workloads.serve.api_key")
    secret_needs = []
    for name, found in sorted(keys.items()):
        source, used_by = roles.get(name, ("other", "a Secret reference"))
        secret_needs.append(SecretNeed(name, tuple(sorted(found)), used_by, source))
    return Needs(tuple(sorted(classes)), tuple(secret_needs))


@dataclass(frozen=True)
class RegistryAuth:
    """The auth files `prepare` makes the registry Secrets from: one for both, or a pull-only
    one beside it."""

    push: Path | None = None
    pull: Path | None = None

    def for_secret(self, loaded: LoadedProject, name: str) -> bytes | None:
        """The dockerconfigjson for Secret `name`: the pull file for the pull Secret where one
        was given, else the shared one; only the project registry's host in it."""
        registry = loaded.project.registry
        if registry is None:
            return None
        path = self.pull if name == registry.pull_secret and self.pull is not None else self.push
        if path is None:
            return None
        option = "--registry-pull-auth" if path == self.pull else "--registry-auth"
        return registry_auth(path, registry_host(registry.repository), option)

    def check(self, loaded: LoadedProject) -> None:
        """Read each given file as its Secret will be made from it: a file without the project
        registry's entry is refused before the cluster is reached."""
        registry = loaded.project.registry
        if registry is None:
            return
        for name in {registry.pull_secret, registry.push_secret}:
            self.for_secret(loaded, name)


def prepare(
    session: ClusterSession,
    loaded: LoadedProject,
    *,
    dry_run: bool,
    registry_auth: RegistryAuth | None = None,
) -> list[Prerequisite]:
    """Check each prerequisite and create the missing ones it has a source for (none when
    `dry_run`); one row each, in the order they are needed."""
    cluster = session.cluster
    wanted = needs(loaded, cluster)
    rows = [_namespace(session, dry_run)]
    rows += _priority_classes(session, wanted.priority_classes, cluster, dry_run)
    auths = registry_auth or RegistryAuth()
    # Read (and refused) before anything is created: a helper-stored credential stops here.
    auth = {
        need.name: auths.for_secret(loaded, need.name)
        for need in wanted.secrets
        if need.source == "registry"
    }
    namespace_ready = rows[0].state in ("present", "created")
    for need in wanted.secrets:
        rows.append(_secret(session, need, dry_run or not namespace_ready, auth.get(need.name)))
    if loaded.project.clusters[cluster].gateway is not None:
        rows.append(gateway_grant_note(session.namespace, cluster))
    return rows


GATEWAY_ROLE = "kimideploy-gateway-deployer"


def gateway_grant_note(namespace: str, cluster: str) -> Prerequisite:
    """What binding the gateway role hands its holder: RBAC checks that a RoleBinding's creator
    holds the role's permissions, never who the subjects are (docs/reference/security.md)."""
    return Prerequisite(
        f"ClusterRole {GATEWAY_ROLE} (bound by an admin)",
        f"clusters.{cluster}.gateway",
        "note",
        f"its rolebindings rights let a holder who also holds kimideploy-deployer bind either "
        f"role, in namespace {namespace}, to any subject (system:authenticated included): "
        "Kubernetes checks the binder's permissions, not the subjects. Bind it only to whom you "
        "would let grant them (docs/reference/security.md, gateway roles)",
    )


def _namespace(session: ClusterSession, dry_run: bool) -> Prerequisite:
    what, used_by = f"namespace {session.namespace}", f"clusters.{session.cluster}.namespace"
    if session.namespace_exists():
        return Prerequisite(what, used_by, "present")
    if dry_run:
        return Prerequisite(what, used_by, "would create")
    session.ensure_namespace()
    return Prerequisite(what, used_by, "created")


def shipped_priority_classes() -> dict[str, dict[str, Any]]:
    text = (repository_root() / "k8s" / "base" / "priorityclasses.yaml").read_text()
    return {doc["metadata"]["name"]: doc for doc in yaml.safe_load_all(text) if doc}


def _priority_classes(
    session: ClusterSession, names: tuple[str, ...], cluster: str, dry_run: bool
) -> list[Prerequisite]:
    shipped = shipped_priority_classes()
    missing = set(session.missing_cluster_objects("PriorityClass", list(names)))
    rows = []
    for name in names:
        what, used_by = f"PriorityClass {name}", f"clusters.{cluster}.priority_classes"
        if name not in missing:
            rows.append(Prerequisite(what, used_by, "present"))
        elif name not in shipped:
            how = (
                f"a cluster admin creates it, or remove it from clusters.{cluster}.priority_classes"
            )
            rows.append(Prerequisite(what, used_by, "missing", how))
        elif dry_run:
            rows.append(Prerequisite(what, used_by, "would create"))
        else:
            try:
                session.apply([shipped[name]])
            except ClusterError as exc:  # cluster-scoped: a namespace's rights are not enough
                how = (
                    "a cluster admin runs `kubectl apply -f k8s/base/priorityclasses.yaml` "
                    f"({exc.message})"
                )
                rows.append(Prerequisite(what, used_by, "missing", how))
                continue
            rows.append(Prerequisite(what, used_by, "created"))
    return rows


def registry_host(repository: str) -> str:
    """The host (with its port) a registry repository lives on: what an auth file is keyed by."""
    return repository.split("/", 1)[0]


DOCKER_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "docker.io")


def _auth_keys(host: str) -> tuple[str, ...]:
    """How an auth file may spell `host`: bare, or as a URL (older `docker login`)."""
    keys = (host, f"https://{host}", f"https://{host}/", f"http://{host}")
    return keys + DOCKER_HUB_KEYS if host in DOCKER_HUB_KEYS else keys


def registry_auth(path: Path, host: str, option: str = "--registry-auth") -> bytes:
    """A Docker/ORAS auth file reduced to the entry of `host`, in the shape kubelet and ORAS
    read: {"auths": {host: {...}}}. Refused, naming what to do: a file without `auths`, one
    with no entry for the host, or one whose entry is kept by a credential helper."""
    try:
        document = json.loads(read_bytes(path, JSON_LIMIT))
    except UnreadableFileError as exc:
        raise UsageError(f"{option} {path}: {str(exc).removeprefix(f'{path}: ')}") from exc
    except ValueError as exc:
        raise UsageError(f"{option} {path}: not JSON ({exc})") from exc
    if not isinstance(document, dict) or not isinstance(document.get("auths"), dict):
        raise UsageError(
            f"{option} {path}: no `auths` mapping (a Docker or ORAS auth file has one)",
            hint="`docker login REGISTRY` or `oras login REGISTRY` writes one "
            "(~/.docker/config.json); pass that file",
        )
    auths: dict[str, Any] = document["auths"]
    entry = next((auths[k] for k in _auth_keys(host) if isinstance(auths.get(k), dict)), None)
    usable = entry is not None and (
        any(entry.get(k) for k in ("auth", "identitytoken", "registrytoken"))
        or bool(entry.get("username") and entry.get("password"))
    )
    helpers: dict[str, Any] = (
        document["credHelpers"] if isinstance(document.get("credHelpers"), dict) else {}
    )
    helper = helpers.get(host) or document.get("credsStore")
    export = (
        f"export a plain one: `oras login --registry-config /tmp/{host}-auth.json {host}` (or "
        f"`docker --config /tmp/{host}-docker login {host}` with no credsStore there), then pass "
        f"that file to {option}"
    )
    if not usable and helper:
        raise UsageError(
            f"{option} {path}: the credentials for {host} are kept by the credential helper "
            f"docker-credential-{helper}, not in the file; a pod cannot run the helper, so a "
            "Secret made from this file would not reach the registry",
            hint=export,
        )
    if not usable:
        raise UsageError(
            f"{option} {path}: no credentials for {host} (the project's registry.repository "
            f"host) among {', '.join(sorted(auths)) or 'no entries'}",
            hint=export,
        )
    return json.dumps({"auths": {host: entry}}, sort_keys=True).encode()


def _secret(
    session: ClusterSession, need: SecretNeed, dry_run: bool, registry_auth: bytes | None
) -> Prerequisite:
    keys = ", ".join(need.keys) or "any"
    what = f"Secret {need.name} (key {keys})"
    have = session.secret_keys(need.name) if session.namespace_exists() else None
    if have is not None:
        absent = [k for k in need.keys if k not in have]
        if not absent:
            return Prerequisite(what, need.used_by, "present")
        return Prerequisite(
            what,
            need.used_by,
            "missing",
            f"it exists without key {', '.join(absent)}: fix it by hand (kimideploy never "
            "replaces a Secret)",
        )
    data, kind, how = _secret_source(session, need, registry_auth)
    if data is None:
        return Prerequisite(what, need.used_by, "missing", how)
    if dry_run:
        return Prerequisite(what, need.used_by, "would create", how)
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": need.name, "namespace": session.namespace, "labels": MANAGED},
        "type": kind,
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }
    created = session.create(body)
    return Prerequisite(what, need.used_by, "created" if created else "present", how)


def _secret_source(
    session: ClusterSession, need: SecretNeed, registry_auth: bytes | None
) -> tuple[dict[str, bytes] | None, str, str]:
    """(data, Secret type, where the value comes from or how to make it)."""
    ns = session.namespace
    key = need.keys[0] if need.keys else "value"
    if need.source == "api-key":
        return {key: secrets.token_urlsafe(32).encode()}, "Opaque", "a new random token"
    if need.source == "hub-token":
        hub_token = os.environ.get(HF_TOKEN_VARIABLE, "")
        if hub_token:
            return {key: hub_token.encode()}, "Opaque", f"from ${HF_TOKEN_VARIABLE}"
        return (
            None,
            "",
            f"set ${HF_TOKEN_VARIABLE} and run again, or `kubectl -n {ns} create secret generic "
            f"{need.name} --from-file={key}=PATH`",
        )
    if need.source == "registry":
        if registry_auth is not None:
            return (
                {DOCKER_CONFIG_KEY: registry_auth},
                "kubernetes.io/dockerconfigjson",
                "from the auth file: the project registry's entry only",
            )
        return (
            None,
            "",
            "pass --registry-auth ~/.docker/config.json (after `oras login`), or `kubectl -n "
            f"{ns} create secret docker-registry {need.name} --docker-server=... "
            "--docker-username=... --docker-password=...`",
        )
    return (
        None,
        "",
        f"`kubectl -n {ns} create secret generic {need.name} --from-literal={key}=...`",
    )


def unready(rows: list[Prerequisite]) -> KimiDeployError | None:
    """The error a prepare that left something missing ends with (exit 1, each one named)."""
    missing = [r for r in rows if r.state == "missing"]
    if not missing:
        return None
    return KimiDeployError(
        f"{len(missing)} prerequisite(s) missing: {', '.join(r.what for r in missing)}",
        hint="each row's `how` says what creates it; run `kimideploy prepare` again after",
    )
