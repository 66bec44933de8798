"""What `prepare` stores from a user's auth files: the project registry's entry only (however the
file spells the host), push and pull from separate files where two are given, and a credential
kept by a helper refused with the helper's name. The Secrets on the control plane:
tests/integration/test_getting_started.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.loading import LoadedProject
from kimideploy.errors import UsageError
from kimideploy.services.prerequisites import RegistryAuth, registry_auth, registry_host


def auth_file(tmp_path: Path, name: str, document: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


def test_only_the_registry_hosts_entry_is_kept(tmp_path: Path) -> None:
    path = auth_file(tmp_path, "config.json", {
        "auths": {"https://index.docker.io/v1/": {"auth": "aHVi"}, "ghcr.io": {"auth": "Z2g="},
                  "registry.corp.example:5000": {"auth": "Y29ycA=="}},
        "credHelpers": {"gcr.io": "gcloud"}, "currentContext": "x",
    })  # fmt: skip
    assert json.loads(registry_auth(path, "ghcr.io")) == {"auths": {"ghcr.io": {"auth": "Z2g="}}}
    assert json.loads(registry_auth(path, "registry.corp.example:5000")) == {
        "auths": {"registry.corp.example:5000": {"auth": "Y29ycA=="}}
    }
    url_spelled = auth_file(tmp_path, "old.json", {"auths": {"https://ghcr.io": {"auth": "Z2g="}}})
    assert json.loads(registry_auth(url_spelled, "ghcr.io"))["auths"] == {
        "ghcr.io": {"auth": "Z2g="}
    }
    assert registry_host("ghcr.io/org/kimideploy") == "ghcr.io"
    assert registry_host("registry.corp.example:5000/ml/k") == "registry.corp.example:5000"


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ({"auths": {"ghcr.io": {}}, "credsStore": "desktop"}, "docker-credential-desktop"),
        ({"auths": {}, "credHelpers": {"ghcr.io": "ecr-login"}}, "docker-credential-ecr-login"),
        ({"auths": {"docker.io": {"auth": "eA=="}}}, "no credentials for ghcr.io"),
        ({"auths": {"ghcr.io": {"username": "u"}}}, "no credentials for ghcr.io"),
    ],
)
def test_a_file_without_a_usable_entry_is_refused_with_what_to_do(
    tmp_path: Path, document: dict[str, Any], named: str
) -> None:
    path = auth_file(tmp_path, "config.json", document)
    with pytest.raises(UsageError) as info:
        registry_auth(path, "ghcr.io")
    assert named in info.value.message
    assert "oras login --registry-config" in (info.value.hint or "")


def test_a_planted_link_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "config.json").symlink_to("/dev/zero")
    with pytest.raises(UsageError, match="symbolic link"):
        registry_auth(tmp_path / "config.json", "ghcr.io")


def test_push_and_pull_come_from_their_own_files(example: LoadedProject, tmp_path: Path) -> None:
    registry = example.project.registry
    assert registry is not None
    host = registry_host(registry.repository)
    push = auth_file(tmp_path, "push.json", {"auths": {host: {"auth": "cHVzaA=="}}})
    pull = auth_file(tmp_path, "pull.json", {"auths": {host: {"auth": "cHVsbA=="}}})
    both = RegistryAuth(push=push, pull=pull)
    assert json.loads(both.for_secret(example, registry.push_secret) or b"")["auths"][host] == {
        "auth": "cHVzaA=="
    }
    assert json.loads(both.for_secret(example, registry.pull_secret) or b"")["auths"][host] == {
        "auth": "cHVsbA=="
    }
    one = RegistryAuth(push=push)
    assert one.for_secret(example, registry.pull_secret) == one.for_secret(
        example, registry.push_secret
    )
    assert RegistryAuth().for_secret(example, registry.push_secret) is None


class AnsweringSession:
    """The few questions `prepare` asks a cluster, answered as a prepared namespace would: our
    own logic under test, not the cluster (the control plane: tests/integration)."""

    namespace, cluster = "kimi", "b300"

    def namespace_exists(self) -> bool:
        return True

    def missing_cluster_objects(self, kind: str, names: list[str]) -> list[str]:
        return []

    def secret_keys(self, name: str) -> list[str]:
        return [".dockerconfigjson", "token"]


def test_prepare_says_what_the_gateway_role_lets_its_holder_grant() -> None:
    from kimideploy.services.prerequisites import prepare
    from tests.unit.test_canary import with_gateway

    rows = prepare(AnsweringSession(), with_gateway("b300"), dry_run=True)  # type: ignore[arg-type]
    [note] = [r for r in rows if r.state == "note"]
    assert note.used_by == "clusters.b300.gateway"
    assert "to any subject (system:authenticated included)" in note.how
    assert "namespace kimi" in note.how
    from kimideploy.config.loading import load_project
    from tests.conftest import EXAMPLE

    plain = prepare(AnsweringSession(), load_project(EXAMPLE), dry_run=True)  # type: ignore[arg-type]
    assert not [r for r in plain if r.state == "note"]
