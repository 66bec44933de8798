"""kimideploy as a tool of its field: the wheel built from the repository carries its templates,
image inputs, Ansible roles, dashboards, schema and example, and runs the demo from a folder that
is not the repository (installed apart from the editable checkout, which it must not read)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

SOURCES = ("src", "setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "kimideploy.yaml",
           "templates", "docker", "ansible", "k8s/base", "schema")  # fmt: skip


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the sources (an in-tree build leaves build/ behind) and
    installed without dependencies (the test's interpreter has them) into a folder of its own."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    for part in SOURCES:
        if (REPO / part).is_dir():
            shutil.copytree(REPO / part, source / part,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))  # fmt: skip
        else:
            (source / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / part, source / part)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    built = subprocess.run([*pip, "wheel", "--no-deps", "-w", str(root / "dist"), str(source)],
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert built.returncode == 0, built.stderr
    # The first run's 47 lines of setuptools deprecations (a `license` table) are gone.
    assert "Deprecat" not in built.stderr and "warning" not in built.stderr.lower(), built.stderr
    (wheel,) = (root / "dist").glob("kimideploy-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for shared in ("templates/k8s/deployment-serve.yaml.j2", "kimideploy.yaml",
                   "k8s/base/dashboards/kimideploy-vllm.json", "schema/kimideploy.schema.json",
                   "ansible/playbooks/gpu_host.yml", "docker/kernel-plans.json"):  # fmt: skip
        assert f"kimideploy/_share/{shared}" in names, shared
    assert "kimideploy/config/example_pins.json" in names
    target = root / "site"
    done = subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return target


def _kimideploy(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIMIDEPLOY_")}
    env["PYTHONPATH"] = str(site)
    return subprocess.run([sys.executable, "-m", "kimideploy", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip


def test_the_wheel_runs_the_demo_outside_the_repository(installed: Path, tmp_path: Path) -> None:
    found = subprocess.run(
        [sys.executable, "-c", "import kimideploy.paths as p; print(p.repository_root())"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(installed)},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert found.stdout.strip() == str(installed / "kimideploy" / "_share")
    demo = _kimideploy(installed, tmp_path, "up", "serve", "--drafter", "v3", "--dry-run")
    assert demo.returncode == 0, demo.stderr
    assert "Plan: serve on rtx6000, drafter v3" in demo.stdout
    assert f"{installed}/kimideploy/_share/kimideploy.yaml" in demo.stderr
    rendered = _kimideploy(installed, tmp_path, "render", "serve", "--drafter", "v3")
    assert rendered.returncode == 0, rendered.stderr
    assert rendered.stdout == (REPO / "k8s/rendered/rtx6000/serve-v3.yaml").read_text()
    assert (installed / "bin" / "kimideploy").is_file()


def test_a_project_kept_in_another_repository_is_used(installed: Path, tmp_path: Path) -> None:
    """A team keeps its kimideploy.yaml in its own infrastructure repository."""
    infra = tmp_path / "infra"
    infra.mkdir()
    text = (REPO / "kimideploy.yaml").read_text().replace("name: kimi-k25 ", "name: teamk ")
    (infra / "kimideploy.yaml").write_text(text)
    # Its own file: judged by the pins its pods would pull (still the example's here), named.
    refused = _kimideploy(installed, infra, "render", "serve", "--drafter", "v3")
    assert refused.returncode == 2 and "model.revision" in refused.stderr, refused.stderr
    rendered = _kimideploy(installed, infra, "render", "serve", "--drafter", "v3", "--force")
    assert rendered.returncode == 0, rendered.stderr
    assert "name: teamk-serve" in rendered.stdout and "built-in example" not in rendered.stderr
