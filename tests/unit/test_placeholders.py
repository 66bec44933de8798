"""The example's placeholder pins, judged by content: a file anywhere that still holds them is
refused by the commands whose pods pull what they name, each placeholder named with its path and
line; the example edited in place is the user's file as soon as a pin is replaced."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kimideploy.cli.main import main
from kimideploy.config.placeholders import (
    EXAMPLE_IMAGE_REPOSITORIES,
    EXAMPLE_NAME,
    PINS_FILE,
    example_pins,
    placeholders_in,
)
from tests.conftest import EXAMPLE, REPO

MODEL_PIN = "3d2f1c0b9a8e7d6c5b4a39281706f5e4d3c2b1a0"


def test_the_shipped_pin_list_is_what_the_example_marks() -> None:
    marked = sorted(example_pins(EXAMPLE.read_text()))
    assert json.loads(PINS_FILE.read_text()) == marked, (
        "the example's EXAMPLE PIN values changed: write them to " + str(PINS_FILE)
    )
    assert MODEL_PIN in marked
    assert "lightseekorg/kimi-k2.5-eagle3" not in marked  # a real repository on a marked line


def test_placeholders_are_named_wherever_they_moved() -> None:
    text = EXAMPLE.read_text().replace("\n  k25:\n", "\n  k25-renamed:\n", 1)
    found = {p.path: p.line for p in placeholders_in(text)}
    assert "model.revision" in found and found["model.revision"] == 15
    assert "drafters.k25-renamed.source.hub.revision" in found
    assert "images.tools.digest" in found and "registry.client.builder" in found


def _pins_replaced(text: str) -> str:
    for number, value in enumerate(sorted(json.loads(PINS_FILE.read_text()))):
        real = f"{number:x}".rjust(len(value.split(":")[-1]), "f")
        text = text.replace(value, value.replace(value.split(":")[-1], real))
    return text


@pytest.fixture
def without_allowance(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.delenv("KIMIDEPLOY_ALLOW_PLACEHOLDERS", raising=False)
    monkeypatch.delenv("KIMIDEPLOY_CONFIG", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    return tmp_path


@pytest.mark.parametrize(
    "args",
    [
        ["up", "serve", "--drafter", "v3", "--yes"],
        ["run", "train", "--cluster", "b300"],
        ["run", "calibrate", "--cluster", "b300"],
        ["run", "datagen", "--cluster", "b300"],
    ],
)
def test_a_copy_anywhere_with_placeholder_pins_is_refused_before_any_cluster(
    without_allowance: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    copy = without_allowance / "infra" / "kimi.yaml"
    copy.parent.mkdir()
    copy.write_text(EXAMPLE.read_text().replace(MODEL_PIN, "f" * 40))
    code = main(["--config", str(copy), *args])
    _, err = capsys.readouterr()
    assert code == 2, err
    assert "placeholder pins" in err and f"{copy}:15: model.revision" not in err
    lines = {p.path: p.line for p in placeholders_in(copy.read_text())}
    # Only the pins this command's pods would pull are named: no command here runs vLLM 0.16.
    assert f"{copy}:{lines['images.vllm-0.16-kimi.digest']}: images.vllm-0.16-kimi" not in err
    named = [line for line in err.splitlines() if line.startswith(f"  {copy}:")]
    assert named and len(named) < len(lines)
    assert "KIMIDEPLOY_ALLOW_PLACEHOLDERS=1" in err and "cannot use kube context" not in err


def test_the_dry_run_refuses_the_pins_up_would_refuse_and_names_them_in_the_plan(
    without_allowance: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One judgement: `up --dry-run` (and its plan document) refuses what `up` refuses, naming
    the same pins; the built-in example picked implicitly (the demo) is still planned."""
    copy = without_allowance / "kimi.yaml"
    copy.write_text(EXAMPLE.read_text().replace("name: kimi-k25", "name: mine", 1))
    up = ["--config", str(copy), "up", "serve", "--drafter", "v3"]
    assert main([*up, "--yes"]) == 2
    refused = capsys.readouterr().err
    assert main([*up, "--dry-run"]) == 2
    planned = capsys.readouterr().err
    assert refused.splitlines()[:5] == planned.splitlines()[:5]
    assert f"{copy}:15: model.revision" in planned and "images.vllm-0.32-kimi.digest" in planned
    assert "images.train-speculators-0.9.digest" not in planned  # serve pulls no train image
    assert main([*up, "--dry-run", "-o", "json"]) == 2
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["refusal"]["exit_code"] == 2 and "model.revision" in plan["refusal"]["reason"]
    run = ["--config", str(copy), "run", "vocab", "--cluster", "b300"]
    assert main([*run, "--dry-run"]) == 2
    assert "images.tools.digest" in capsys.readouterr().err
    # render, and the GitOps tree, refuse the same pins (--force renders them anyway).
    render = ["--config", str(copy), "render", "serve", "--drafter", "v3"]
    assert main(render) == 2
    assert "images.vllm-0.32-kimi.digest" in capsys.readouterr().err
    tree = without_allowance / "tree"
    assert main([*render, "--kustomize", str(tree), "--overlay", "b300"]) == 2
    assert "overlay rtx6000: serve on rtx6000 would pull" in capsys.readouterr().err
    assert not tree.exists()
    assert main([*render, "--force"]) == 0
    assert "kind: Deployment" in capsys.readouterr().out
    # The demo: the example itself, picked implicitly, plans (its real `up` is refused first).
    assert main(["up", "serve", "--drafter", "v3", "--dry-run"]) == 0
    assert main(["render", "serve", "--drafter", "v3"]) == 0


def test_the_example_renamed_in_place_is_judged_by_its_pins_not_as_the_example(
    without_allowance: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = without_allowance / "checkout"
    home.mkdir()
    for part in ("templates", "k8s", "docker", "schema", "ansible"):
        (home / part).symlink_to(REPO / part)
    text = EXAMPLE.read_text().replace("name: kimi-k25", "name: mine", 1)
    (home / "kimideploy.yaml").write_text(text)
    monkeypatch.setenv("KIMIDEPLOY_HOME", str(home))
    monkeypatch.chdir(home)
    assert main(["up", "serve", "--drafter", "v3", "--yes"]) == 2
    err = capsys.readouterr().err
    assert "built-in example" not in err and "placeholder pins" in err and "model.revision" in err


def test_the_example_name_is_the_examples() -> None:
    assert f"\nname: {EXAMPLE_NAME} " in EXAMPLE.read_text()


def test_the_example_edited_in_place_is_the_users_file(
    without_allowance: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The repository's own kimideploy.yaml, pins replaced in place and used without --config,
    goes past the guard (to the kube context, which this machine lacks: exit 3, not 2)."""
    home = without_allowance / "checkout"
    home.mkdir()
    for part in ("templates", "k8s", "docker", "schema", "ansible"):
        (home / part).symlink_to(REPO / part)
    (home / "kimideploy.yaml").write_text(_pins_replaced(EXAMPLE.read_text()))
    monkeypatch.setenv("KIMIDEPLOY_HOME", str(home))
    monkeypatch.chdir(home)
    code = main(["up", "serve", "--drafter", "v3", "--yes"])
    _, err = capsys.readouterr()
    assert "built-in example" not in err and "placeholder" not in err, err
    assert code == 3 and "kube context" in err, err
    # Unedited in place, it is still the example: refused as before.
    shutil.copy(EXAMPLE, home / "kimideploy.yaml")
    assert main(["up", "serve", "--drafter", "v3", "--yes"]) == 2
    assert "this would use the built-in example" in capsys.readouterr().err


def test_commands_that_replace_pins_are_not_refused_for_them(
    without_allowance: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`image lock` writes the digest that replaces a placeholder: refusing it for placeholders
    would leave no way out."""
    copy = without_allowance / "kimideploy.yaml"
    shutil.copy(EXAMPLE, copy)
    digest = "sha256:" + "a" * 64
    assert main(["--config", str(copy), "image", "lock", "tools", "--digest", digest]) == 0
    assert f"digest: {digest}" in copy.read_text()
    capsys.readouterr()


def test_a_push_to_the_examples_own_registry_is_refused_before_any_build(
    without_allowance: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The example's image repositories are kimideploy's registry, marked EXAMPLE in the file:
    `image build --push` on them would push to someone else's registry."""
    import yaml

    data = yaml.safe_load(EXAMPLE.read_text())
    assert {i["repository"] for i in data["images"].values()} == EXAMPLE_IMAGE_REPOSITORIES
    for line in EXAMPLE.read_text().splitlines():
        if line.strip().startswith("repository: ghcr.io/kimideploy/") and "artifacts" not in line:
            assert "# EXAMPLE: your registry" in line, line
    copy = without_allowance / "kimideploy.yaml"
    copy.write_text(EXAMPLE.read_text().replace("name: kimi-k25", "name: mine", 1))
    assert main(["--config", str(copy), "image", "build", "tools", "--push"]) == 2
    err = capsys.readouterr().err
    assert "images.tools.repository is still the example's (ghcr.io/kimideploy/tools)" in err
    assert "set images.tools.repository to a registry path you can push to" in err


@pytest.mark.parametrize(
    ("output", "says"),
    [
        ("ERROR: failed to push ghcr.io/me/vllm: unauthorized: authentication required",
         "docker login HOST"),
        ("ERROR: failed to solve: nvidia/cuda:12.9.1: failed to resolve source metadata for "
         "docker.io/nvidia/cuda: dial tcp: lookup registry-1.docker.io: no such host",
         "a base image could not be pulled"),
        ("#14 ERROR: process \"/bin/sh -c python -m kimideploy.images.selfcheck native\" did "
         "not complete successfully: exit code: 1", "the image's self-check failed"),
        ("#9 ERROR: process \"/bin/sh -c pip install -r constraints.txt\" did not complete "
         "successfully: exit code: 1", "--context-only DIR"),
    ],
)  # fmt: skip
def test_each_docker_failure_class_gets_its_own_hint(output: str, says: str) -> None:
    from kimideploy.images.build import failure_hint

    assert says in failure_hint(output)
