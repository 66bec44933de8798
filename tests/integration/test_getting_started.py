"""docs/usage/getting-started.md, run as written: every `kimideploy` command of its blocks, in
its order, against the test control plane, with what the guide tells the user to do by hand
(replacing the pins, naming the context) done here. A command added to the guide fails this test
until it is run here too. Also `prepare` on its own: what it creates, what it never replaces."""

from __future__ import annotations

import base64
import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kimideploy.cli.main import main
from kimideploy.config.placeholders import PINS_FILE
from tests.conftest import REPO
from tests.integration.conftest import harness

pytestmark = pytest.mark.integration
GUIDE = REPO / "docs" / "usage" / "getting-started.md"
FAST = ["--poll", "0.2"]
GUIDE_COMMANDS = [
    "kimideploy init infra --cluster rtx6000",
    "kimideploy --config infra/kimideploy.yaml config validate",
    "kimideploy plan requirements",
    "kimideploy prepare --dry-run --registry-auth ~/.docker/config.json",
    "kimideploy prepare --registry-auth ~/.docker/config.json",
    "kimideploy data put mixed-v1.jsonl --as prompts/mixed-v1.jsonl",
    "kimideploy up serve --drafter none --dry-run",
    "kimideploy up serve --drafter none",
    "kimideploy status",
]


def guide_commands() -> list[str]:
    blocks = re.findall(r"```console\n(.*?)```", GUIDE.read_text(), re.DOTALL)
    return [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()
            if line.startswith("kimideploy ")]  # fmt: skip


def make_it_yours(path: Path, namespace: str) -> None:
    """What the guide asks the user to edit: every pin replaced, the context and namespace."""
    text = path.read_text()
    for number, value in enumerate(json.loads(PINS_FILE.read_text())):
        tail = value.split(":")[-1]
        text = text.replace(tail, f"{number:x}".rjust(len(tail), "c"))
    text = text.replace("kube_context: rtx6000", "kube_context: kimideploy-test", 1)
    text = re.sub(r"(\n  rtx6000:\n(?:    .*\n)*?    namespace: )\S+", rf"\g<1>{namespace}", text)
    path.write_text(text)


@pytest.fixture
def newcomer(
    testcluster: harness.TestCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    """A shell of someone new: their own folder, HOME with a registry login, HF_TOKEN set, and
    none of the suite's allowances."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KUBECONFIG", str(testcluster.kubeconfig))
    monkeypatch.setenv("HF_TOKEN", "hf_getting_started")
    monkeypatch.delenv("KIMIDEPLOY_ALLOW_PLACEHOLDERS", raising=False)
    monkeypatch.delenv("KIMIDEPLOY_CONFIG", raising=False)
    docker = tmp_path / "home" / ".docker" / "config.json"
    docker.parent.mkdir(parents=True)
    login = base64.b64encode(b"robot:secret").decode()
    docker.write_text(json.dumps({"auths": {"ghcr.io": {"auth": login}}}))
    (tmp_path / "infra").mkdir()  # the folder the guide works in, the prompt file in it
    (tmp_path / "infra" / "mixed-v1.jsonl").write_text('{"prompt": "A haiku about PCIe."}\n' * 50)
    return tmp_path


def test_the_guide_runs_as_written(
    newcomer: Path,
    namespace: str,
    testcluster: harness.TestCluster,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert guide_commands() == GUIDE_COMMANDS
    for line in GUIDE_COMMANDS:
        args = [a.replace("~", str(newcomer / "home")) for a in shlex.split(line)[1:]]
        if args[0] == "up" and "--dry-run" not in args:
            args += ["--yes", "--scheduling-grace", "2", *FAST]
        if args[:2] == ["data", "put"]:
            args += FAST
        code = main(args)
        out, err = capsys.readouterr()
        assert code == 0, f"{line}\n{out}\n{err}"
        if args[0] == "init":
            assert "placeholder pin(s) to replace" in out
            make_it_yours(newcomer / "infra" / "kimideploy.yaml", namespace)
        if args[-2:] == ["config", "validate"]:
            monkeypatch.chdir(newcomer / "infra")  # "run from infra/"
        if args[:2] == ["plan", "requirements"]:
            assert "host RAM per GPU node" in out and "claim kimi-k25-models" in out
        if args[:2] == ["prepare", "--dry-run"]:
            assert "would create" in out and "kimideploy-registry-push" in out
            assert "kimideploy-registry-push" not in testcluster.kubectl(
                "-n", namespace, "get", "secrets", "-o", "name"
            )
        if args[:2] == ["data", "put"]:
            assert "written /data/prompts/mixed-v1.jsonl" in out
    secret = json.loads(testcluster.kubectl(
        "-n", namespace, "get", "secret", "kimideploy-registry-push", "-o", "json"
    ))  # fmt: skip
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    auth = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    assert auth["auths"]["ghcr.io"]["auth"] == base64.b64encode(b"robot:secret").decode()
    deployments = testcluster.kubectl("-n", namespace, "get", "deployments", "-o", "name")
    assert "deployment.apps/kimi-k25-serve" in deployments
    leftovers = testcluster.kubectl("-n", namespace, "get", "configmaps,jobs", "-o", "name")
    assert "-put-" not in leftovers  # the upload's parts and Job are gone


def test_prepare_creates_what_it_can_and_never_replaces_a_secret(
    kd: Callable[..., tuple[int, str, str]],
    namespace: str,
    testcluster: harness.TestCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a rented cluster (b300): the hub token from $HF_TOKEN, the registry push Secret only
    with an auth file; a Secret that exists is left as it is, and one missing its key is named."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    code, out, err = kd("prepare", "--cluster", "b300", "-o", "json")
    rows = {r["prerequisite"]: r for r in json.loads(out)}
    assert code == 1 and "2 prerequisite(s) missing" in err
    assert rows[f"namespace {namespace}"]["state"] == "present"
    assert rows["Secret hf-token (key token)"]["state"] == "missing"
    assert "set $HF_TOKEN" in rows["Secret hf-token (key token)"]["how"]
    assert (
        "--registry-auth" in rows["Secret kimideploy-registry-push (key .dockerconfigjson)"]["how"]
    )
    monkeypatch.setenv("HF_TOKEN", "hf_first")
    auth = tmp_path / "config.json"
    auth.write_text(json.dumps({"auths": {"ghcr.io": {"auth": "eDp5"}}}))
    code, out, err = kd("prepare", "--cluster", "b300", "--registry-auth", str(auth))
    assert code == 0, err
    stored = testcluster.kubectl("-n", namespace, "get", "secret", "hf-token", "-o",
                                 "jsonpath={.data.token}")  # fmt: skip
    assert base64.b64decode(stored) == b"hf_first"
    monkeypatch.setenv("HF_TOKEN", "hf_second")
    code, out, err = kd("prepare", "--cluster", "b300", "-o", "json")
    assert code == 0 and {r["state"] for r in json.loads(out)} == {"present"}, out
    stored = testcluster.kubectl("-n", namespace, "get", "secret", "hf-token", "-o",
                                 "jsonpath={.data.token}")  # fmt: skip
    assert base64.b64decode(stored) == b"hf_first"  # never replaced
    testcluster.kubectl("-n", namespace, "delete", "secret", "hf-token")
    testcluster.kubectl("-n", namespace, "create", "secret", "generic", "hf-token",
                        "--from-literal=other=x")  # fmt: skip
    code, out, err = kd("prepare", "--cluster", "b300")
    assert code == 1 and "exists without key token" in out
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    code, _, err = kd("prepare", "--cluster", "b300", "--registry-auth", str(bad))
    assert code == 2 and "no `auths` mapping" in err


def _stored_auth(testcluster: harness.TestCluster, namespace: str, name: str) -> Any:
    secret = json.loads(testcluster.kubectl("-n", namespace, "get", "secret", name, "-o", "json"))
    return json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))


def test_prepare_stores_only_the_project_registrys_credentials(
    kd: Callable[..., tuple[int, str, str]],
    namespace: str,
    testcluster: harness.TestCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A user's ~/.docker/config.json holds every registry they logged in to: the Secret gets
    the project registry's entry only; a helper-kept credential is refused with the helper's
    name before anything is created. (Push and pull from two files: tests/unit/test_prepare_auth.py.)"""
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    helper = tmp_path / "helper.json"
    helper.write_text(json.dumps({"auths": {"ghcr.io": {}}, "credsStore": "osxkeychain"}))
    code, _, err = kd("prepare", "--cluster", "b300", "--registry-auth", str(helper))
    assert code == 2 and "docker-credential-osxkeychain" in err and "oras login" in err, err
    assert "kimideploy-registry-push" not in testcluster.kubectl(
        "-n", namespace, "get", "secrets", "-o", "name"
    )
    everything = tmp_path / "config.json"
    everything.write_text(json.dumps({"auths": {
        "https://index.docker.io/v1/": {"auth": "aHViOmh1Yg=="},
        "registry.corp.example": {"auth": "Y29ycDpjb3Jw"},
        "ghcr.io": {"auth": "cHVzaDpwdXNo"},
    }, "credHelpers": {"gcr.io": "gcloud"}}))  # fmt: skip
    code, _, err = kd("prepare", "--cluster", "b300", "--registry-auth", str(everything))
    assert code == 0, err
    push = _stored_auth(testcluster, namespace, "kimideploy-registry-push")
    assert push == {"auths": {"ghcr.io": {"auth": "cHVzaDpwdXNo"}}}
