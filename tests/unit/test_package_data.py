"""Every non-Python file inside the package is package data, so an install carries it (once
`host check` read remote/payloads/host_probe.sh, which no pattern named)."""

from __future__ import annotations

import fnmatch
import tomllib

from tests.conftest import REPO


def test_every_data_file_in_the_package_is_named_by_a_package_data_pattern() -> None:
    settings = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = settings["package-data"]["kimideploy"]
    package = REPO / "src" / "kimideploy"
    data = [
        path.relative_to(package).as_posix()
        for path in package.rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    ]
    assert "remote/payloads/host_probe.sh" in data
    unnamed = [f for f in data if not any(fnmatch.fnmatchcase(f, p) for p in patterns)]
    assert not unnamed, f"add to [tool.setuptools.package-data] in pyproject.toml: {unnamed}"
