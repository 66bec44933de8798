"""`kimideploy init`: a project file for the user's clusters that validates, keeps every
placeholder marked and refused until replaced, and never replaces an existing file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kimideploy.cli.main import main
from kimideploy.config.loading import load_project
from kimideploy.config.placeholders import PINS_FILE


def test_init_writes_the_chosen_clusters_and_names_the_placeholders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KIMIDEPLOY_ALLOW_PLACEHOLDERS", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    infra = tmp_path / "infra"
    assert main(["init", str(infra), "--cluster", "b300", "--cluster", "rtx6000"]) == 0
    out = capsys.readouterr().out
    path = infra / "kimideploy.yaml"
    project = load_project(path).project
    assert sorted(project.clusters) == ["b300", "rtx6000"] and project.default_cluster == "b300"
    text = path.read_text()
    assert "Written by `kimideploy init`" in text and "built-in example" not in text
    assert "# Rented B300 NVL8 nodes" in text and "B200 NVL8" not in text
    assert "kimideploy.yaml:13: model.revision" in out and "image lock" in text
    config = ["--config", str(path)]
    # render judges the pins as up does (the same ones, named); --force renders them anyway.
    assert main([*config, "render", "serve", "--drafter", "v3"]) == 2
    assert f"{path}:13: model.revision" in capsys.readouterr().err
    assert main([*config, "render", "serve", "--drafter", "v3", "--force"]) == 0
    capsys.readouterr()
    assert main([*config, "up", "serve", "--drafter", "v3", "--yes"]) == 2
    assert f"{path}:13: model.revision" in capsys.readouterr().err
    for number, value in enumerate(json.loads(PINS_FILE.read_text())):
        tail = value.split(":")[-1]
        text = text.replace(tail, f"{number:x}".rjust(len(tail), "e"))
    path.write_text(text)
    assert main([*config, "up", "serve", "--drafter", "v3", "--yes"]) == 3  # past every guard
    assert "kube context" in capsys.readouterr().err


def test_init_never_replaces_a_project_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "kimideploy.yaml"
    mine.write_text("name: mine\n")
    assert main(["init", str(tmp_path), "--cluster", "rtx6000"]) == 2
    assert "init never replaces a project file" in capsys.readouterr().err
    assert mine.read_text() == "name: mine\n" and sorted(p.name for p in tmp_path.iterdir()) == [
        "kimideploy.yaml"
    ]


def test_init_refuses_unknown_clusters_and_asks_only_on_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["init", str(tmp_path), "--cluster", "h100"]) == 2
    err = capsys.readouterr().err
    assert "--cluster h100: the example describes rtx6000, b200, b300" in err
    assert main(["init", str(tmp_path)]) == 2  # pytest's stdin is no terminal
    assert "which clusters?" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_init_does_not_write_through_a_link_planted_at_its_temporary_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    target = tmp_path / "project"
    target.mkdir()
    victim = tmp_path / "victim"
    # The name round four's init wrote its temporary file under (a guessable pid).
    for pid in {os.getpid(), os.getpid() + 1}:
        (target / f".kimideploy.yaml.{pid}.tmp").symlink_to(victim)
    assert main(["init", str(target), "--cluster", "rtx6000"]) == 0
    assert not victim.exists()
    assert (target / "kimideploy.yaml").is_file()


def test_only_the_packages_own_checkout_lends_it_templates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kimideploy import paths

    monkeypatch.delenv("KIMIDEPLOY_HOME", raising=False)
    repo = tmp_path / "someones-repo"
    (repo / "templates").mkdir(parents=True)
    (repo / "kimideploy.yaml").write_text("name: not-ours\n")
    (repo / "src" / "kimideploy").mkdir(parents=True)
    installed = repo / "target" / "kimideploy"  # `pip install --target target` inside it
    installed.mkdir(parents=True)
    monkeypatch.setattr(paths, "package_dir", lambda: installed)
    assert paths.repository_root() == installed / "_share"
    monkeypatch.setattr(paths, "package_dir", lambda: repo / "src" / "kimideploy")
    assert paths.repository_root() == repo
