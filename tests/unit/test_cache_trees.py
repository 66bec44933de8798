"""Cache trees several test sessions ask for at once (the vLLM sources, the patched overlay):
made in a temporary sibling and renamed in whole, so a reader never sees half of one."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kimideploy.images.verify import built_once


def test_two_processes_asking_at_once_both_get_one_complete_tree(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "tree"
    both_building = threading.Barrier(2)
    builds: list[str] = []
    got: list[Path] = []

    def build(into: Path) -> None:
        both_building.wait(timeout=10)  # neither has renamed in yet
        name = threading.current_thread().name
        builds.append(name)
        (into / "pkg").mkdir()
        (into / "pkg" / "__init__.py").write_text(name)

    def ask() -> None:
        got.append(built_once(target, "pkg/__init__.py", build))

    threads = [threading.Thread(target=ask, name=f"t{i}") for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(builds) == ["t0", "t1"] and got == [target, target]
    assert (target / "pkg" / "__init__.py").read_text() in builds  # one build, whole
    assert sorted(p.name for p in target.parent.iterdir()) == ["tree"]  # no partial left
    assert oct((target).stat().st_mode & 0o777) == oct(0o755)
    built_once(target, "pkg/__init__.py", lambda into: pytest.fail("built again"))


def test_a_failed_build_leaves_nothing_and_a_stale_tree_is_replaced(tmp_path: Path) -> None:
    target = tmp_path / "tree"

    def broken(into: Path) -> None:
        (into / "half").write_text("x")
        raise RuntimeError("patch 0001 does not apply")

    with pytest.raises(RuntimeError, match="0001"):
        built_once(target, "done", broken)
    assert list(tmp_path.iterdir()) == []

    target.mkdir()
    (target / "half").write_text("left by an interrupted older build")
    built_once(target, "done", lambda into: (into / "done").write_text("ok"))
    assert sorted(p.name for p in target.iterdir()) == ["done"]
