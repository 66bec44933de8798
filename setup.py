"""The wheel carries what kimideploy reads besides its Python code (templates, image inputs,
Ansible roles, base manifests and dashboards, the schema, the example project) under
kimideploy/_share/, laid out as in the repository. An editable install reads the repository
itself (kimideploy.paths), so nothing is copied then. Everything else is in pyproject.toml."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHARED = (
    "templates",
    "docker",
    "ansible",
    "k8s/base",
    "schema",
    "kimideploy.yaml",
    "pyproject.toml",
    "README.md",
)


class BuildWithShare(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        share = Path(self.build_lib) / "kimideploy" / "_share"
        for item in SHARED:
            source, target = Path(item), share / item
            if source.is_dir():
                shutil.copytree(
                    source,
                    target,
                    dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                )
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)


setup(cmdclass={"build_py": BuildWithShare})
