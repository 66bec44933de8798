"""Layering (ARCHITECTURE §2) and the light CLI path, enforced on the source itself."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SRC = REPO / "src" / "kimideploy"
HEAVY = ("torch", "vllm", "transformers", "speculators", "kubernetes", "fabric", "paramiko")

# package -> the kimideploy packages it may import (besides itself, errors and paths)
ALLOWED = {
    "config": set(),
    "plan": {"config"},
    "render": {"config", "plan"},
    "cluster": {"config", "plan"},
    "images": {"config", "plan", "render", "remote"},
    "remote": {"config"},
    "provision": {"config", "remote"},
    # workloads: `data inspect --sample` renders with the pods' own chat-template renderer.
    "services": {
        "config",
        "plan",
        "render",
        "cluster",
        "images",
        "remote",
        "provision",
        "workloads",
    },
    "cli": {"services", "config", "plan"},
    "workloads": {"config"},
}
# third-party modules confined to one package
CONFINED = {
    "click": "cli",
    "rich": "cli",
    "kubernetes": "cluster",
    "fabric": "remote",
    "invoke": "remote",
}


def imports_of(path: Path) -> list[tuple[str, bool]]:
    """(module, at_top_level) for every import in a file."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, id(node) in top))
    return found


def package_of(path: Path) -> str:
    rel = path.relative_to(SRC).parts
    return rel[0] if len(rel) > 1 else ""


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_layering(path: Path) -> None:
    package = package_of(path)
    for module, at_top in imports_of(path):
        parts = module.split(".")
        if parts[0] == "kimideploy" and len(parts) > 1 and package in ALLOWED:
            target = parts[1]
            shared = {
                "errors",
                "paths",
                "gpuinfo",
                "vllm_metrics",
                "safetensors_files",
                "drafter_files",
                "chat_template",
                "__init__",
            }
            allowed = ALLOWED[package] | {package} | shared
            if target in {"workloads"} and package != "workloads":
                pytest.fail(f"{path}: nothing imports kimideploy.workloads")
            assert target in allowed or target == "__version__", f"{path}: {package} -> {target}"
        owner = CONFINED.get(parts[0])
        if owner is not None:
            assert package == owner, f"{path}: {parts[0]} may only be imported in {owner}/"
        if parts[0] in HEAVY and package == "workloads":
            assert not at_top, f"{path}: import {module} inside functions in workloads/"


def loaded_modules(*args: str) -> set[str]:
    code = (
        "import sys, json\n"
        "from kimideploy.cli.main import main\n"
        f"code = main({list(args)!r})\n"
        "sys.stdout.flush()\n"
        "print('\\nMODULES=' + json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    line = next(x for x in result.stderr.splitlines() if x.startswith("MODULES="))
    return {m.split(".")[0] for m in json.loads(line.removeprefix("MODULES="))}


@pytest.mark.parametrize("args", [("--help",), ("render", "serve", "--drafter", "v3")])
def test_cli_path_loads_no_heavy_library(args: tuple[str, ...]) -> None:
    loaded = loaded_modules(*args)
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_help_does_not_even_load_pydantic_or_jinja() -> None:
    loaded = loaded_modules("--help")
    assert not loaded & {"pydantic", "jinja2", "jsonschema", "yaml"}
