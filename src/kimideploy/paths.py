"""Where the source tree's non-Python inputs live (templates, the built-in example config).

kimideploy is installed editable from its repository (see README): the templates/ folder and the
example kimideploy.yaml are reviewed files at the top of the repository, so they are read from there
rather than duplicated into package data. KIMIDEPLOY_HOME points elsewhere when needed.
"""

from __future__ import annotations

import os
from pathlib import Path


def repository_root() -> Path:
    """The folder that holds templates/ and the example kimideploy.yaml."""
    override = os.environ.get("KIMIDEPLOY_HOME")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2]


def templates_dir() -> Path:
    return repository_root() / "templates" / "k8s"


def dashboard_path() -> Path:
    """The shipped Grafana dashboard that every serve release's dashboard ConfigMap specialises."""
    return repository_root() / "k8s" / "base" / "dashboards" / "kimideploy-vllm.json"


def example_config_path() -> Path:
    return repository_root() / "kimideploy.yaml"


def cache_root() -> Path:
    """Versioned build products and caches (venvs, wheels, derived schemas): KIMIDEPLOY_CACHE, else
    ~/.cache/kimideploy."""
    return Path(os.environ.get("KIMIDEPLOY_CACHE", Path.home() / ".cache" / "kimideploy"))
