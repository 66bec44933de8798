"""`kimideploy --help` from the help cache: the same text click prints, and never a stale one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

CONSOLE = (
    "import sys, json\n"
    "sys.argv = ['kimideploy', *json.loads(sys.argv[1])]\n"
    "from kimideploy.cli.launch import entrypoint\n"
    "try:\n"
    "    entrypoint()\n"
    "finally:\n"
    "    sys.stdout.flush()\n"
    "    print('MODULES=' + json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
)
"""What the console script runs, reporting the modules it loaded."""


def console(cache: Path, *args: str, columns: int = 80) -> tuple[str, set[str]]:
    env = {**os.environ, "KIMIDEPLOY_CACHE": str(cache), "COLUMNS": str(columns)}
    done = subprocess.run(
        [sys.executable, "-c", CONSOLE, json.dumps(args)],
        capture_output=True, text=True, cwd=REPO, env=env, check=True,
    )  # fmt: skip
    line = next(x for x in done.stderr.splitlines() if x.startswith("MODULES="))
    return done.stdout, set(json.loads(line.removeprefix("MODULES=")))


def click_help(columns: int) -> str:
    """What click itself prints for `kimideploy --help` (no cache involved)."""
    env = {**os.environ, "COLUMNS": str(columns)}
    code = "from kimideploy.cli.main import main; main(['--help'])"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, check=True
    ).stdout


@pytest.mark.parametrize("columns", [60, 80, 140])
def test_the_cached_help_is_what_click_prints(tmp_path: Path, columns: int) -> None:
    expected = click_help(columns)
    assert "Commands:" in expected and "render" in expected
    first, first_modules = console(tmp_path, "--help", columns=columns)
    again, again_modules = console(tmp_path, "--help", columns=columns)
    short, _ = console(tmp_path, "-h", columns=columns)
    assert first == again == short == expected
    assert "click" in first_modules  # a miss renders it with click and keeps it
    assert "click" not in again_modules  # a hit does not even import click
    assert len(list((tmp_path / "help").glob("root-*.txt"))) == 1


def test_a_kept_help_for_other_sources_is_not_served(tmp_path: Path) -> None:
    """The first line names the sources the text came from; a changed cli/main.py (or click, or
    version, or width) reads as a miss and is replaced."""
    from kimideploy.cli import root_help

    console(tmp_path, "--help")
    [kept] = (tmp_path / "help").glob("root-*.txt")
    key, _, text = kept.read_text().partition("\n")
    main_py = Path(root_help.__file__).with_name("main.py").stat()
    assert f"main.py:{main_py.st_size}:{main_py.st_mtime_ns}" in key and "click" in key
    kept.write_text(key.replace(str(main_py.st_mtime_ns), "1") + "\nStale help\n")
    out, modules = console(tmp_path, "--help")
    assert out == text and "click" in modules
    assert kept.read_text() == f"{key}\n{text}"


def test_other_arguments_and_an_unwritable_cache_go_through_click(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    out, modules = console(blocker / "below", "--help")  # the cache cannot be made
    assert out == click_help(80) and not (blocker / "below").exists()
    out, modules = console(tmp_path, "drafter", "--help")
    assert "Usage: kimideploy drafter" in out and "click" in modules
    assert not (tmp_path / "help").exists()


@pytest.mark.parametrize("override", [None, "/srv/cache"])
def test_the_help_is_kept_under_the_cache_root(
    override: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kimideploy.cli.root_help import cache_file
    from kimideploy.paths import cache_root

    if override is None:
        monkeypatch.delenv("KIMIDEPLOY_CACHE", raising=False)
    else:
        monkeypatch.setenv("KIMIDEPLOY_CACHE", override)
    assert Path(cache_file(78)).parent == cache_root() / "help"
