"""`drafter new NAME`: the registry entry a training run writes into, declared before the run, so
the README's lifecycle (`run train --drafter v4`, then `up serve --drafter v4`) runs on the file
`init` wrote; "unknown drafter" says how to declare one."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimideploy.cli.main import main
from kimideploy.config.loading import load_project


@pytest.fixture
def project_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert main(["init", str(tmp_path), "--cluster", "rtx6000", "--cluster", "b300"]) == 0
    capsys.readouterr()
    return tmp_path / "kimideploy.yaml"


def test_a_declared_drafter_is_trained_and_served_by_name(
    project_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = ["--config", str(project_file)]
    assert main([*config, "up", "serve", "--drafter", "v4", "--dry-run"]) == 2
    assert "declared first: `kimideploy drafter new v4`" in capsys.readouterr().err
    before = project_file.read_text()
    assert main([*config, "drafter", "new", "v4", "--cluster", "b300"]) == 0
    out, err = capsys.readouterr()
    assert "drafters.v4 added" in out and "status planned" in out
    assert "next: kimideploy run train --drafter v4 --cluster b300" in err
    after = project_file.read_text()
    assert [line for line in before.splitlines() if line.lstrip().startswith("#")] == [
        line for line in after.splitlines() if line.lstrip().startswith("#")
    ]  # every comment kept
    drafter = load_project(project_file).project.eagle_drafter("v4")
    train_drafter = load_project(project_file).project.eagle_drafter("v3")
    assert drafter.source.path == "drafters/v4" and drafter.status == "planned"
    assert drafter.aux_layer_ids == train_drafter.aux_layer_ids
    assert drafter.lineage is not None and drafter.lineage.base_drafter is None
    assert main([*config, "run", "train", "--drafter", "v4", "--cluster", "b300", "--dry-run"]) == 0
    assert "Plan: train on b300, drafter v4" in capsys.readouterr().out
    assert main([*config, "drafter", "new", "v5", "--base", "v3"]) == 0
    capsys.readouterr()
    lineage = load_project(project_file).project.eagle_drafter("v5").lineage
    assert lineage is not None and lineage.base_drafter == "v3"


def test_an_existing_name_is_refused_and_the_file_left_as_it_was(
    project_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = project_file.read_text()
    assert main(["--config", str(project_file), "drafter", "new", "v3"]) == 2
    assert "drafter v3 exists already" in capsys.readouterr().err
    assert project_file.read_text() == text
    assert main(["--config", str(project_file), "drafter", "new", "v6", "--base", "nope"]) == 2
    assert project_file.read_text() == text


def test_the_built_in_example_is_never_edited(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KIMIDEPLOY_CONFIG", raising=False)
    assert main(["drafter", "new", "v4"]) == 2
    assert "this would use the built-in example" in capsys.readouterr().err
