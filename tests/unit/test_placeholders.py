"""The example's placeholder pins, judged by content: a file anywhere that still holds them is
refused by the commands whose pods pull what they name, each placeholder named with its path and
line; the example edited in place is the user's file as soon as a pin is replaced."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kimideploy.cli.main import main
from kimideploy.config.placeholders import PINS_FILE, example_pins, placeholders_in
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
        ["drafter", "pull", "k25", "--cluster", "b300"],
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
    [line] = [
        p.line
        for p in placeholders_in(copy.read_text())
        if p.path == "images.vllm-0.16-kimi.digest"
    ]
    assert f"{copy}:{line}: images.vllm-0.16-kimi.digest" in err
    assert "KIMIDEPLOY_ALLOW_PLACEHOLDERS=1" in err and "cannot use kube context" not in err


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
