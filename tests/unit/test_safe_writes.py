"""What kimideploy writes goes where it says, whole, and is not lost to a concurrent writer: no
writes through planted links, no lost `image lock` edit."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from kimideploy.cli.main import main
from kimideploy.config.loading import load_project
from kimideploy.images.lock import lock_digest
from tests.conftest import EXAMPLE


def test_kustomize_refuses_a_tree_with_links_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A symlinked base/ would have had the render write into wherever it points."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    tree = tmp_path / "gitops"
    assert main(["render", "serve", "--kustomize", str(tree)]) == 0
    capsys.readouterr()
    import shutil

    shutil.rmtree(tree / "base")
    (tree / "base").symlink_to(elsewhere, target_is_directory=True)
    code = main(["render", "serve", "--kustomize", str(tree)])
    err = capsys.readouterr().err
    assert code == 2 and "holds symbolic links (base)" in err and "nothing was written" in err
    assert list(elsewhere.iterdir()) == []
    linked = tmp_path / "linked"
    linked.symlink_to(elsewhere, target_is_directory=True)
    assert main(["render", "serve", "--kustomize", str(linked)]) == 2
    assert list(elsewhere.iterdir()) == []


def _lock(config: str, name: str, digest: str, barrier: object) -> None:
    barrier.wait()  # type: ignore[attr-defined]
    lock_digest(Path(config), name, digest)


def test_two_concurrent_image_locks_both_keep_their_edit(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    for trial in range(10):
        config = tmp_path / f"{trial}" / "kimideploy.yaml"
        config.parent.mkdir()
        config.write_text(EXAMPLE.read_text())
        barrier = context.Barrier(2)
        edits = {"vllm-0.32-kimi": "sha256:" + "1" * 64, "tools": "sha256:" + "2" * 64}
        racers = [context.Process(target=_lock, args=(str(config), name, digest, barrier))
                  for name, digest in edits.items()]  # fmt: skip
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join(timeout=60)
            assert racer.exitcode == 0
        images = load_project(config).project.images
        assert {name: images[name].digest for name in edits} == edits, trial
        assert sorted(p.name for p in config.parent.iterdir()) == ["kimideploy.yaml"]
