"""Where the non-Python inputs live (templates, image inputs, Ansible roles, the example config).

They are reviewed files at the top of the repository. An editable install (scripts/setup) reads
them there; a wheel (`pip install .`, `uv tool install`) carries a copy under kimideploy/_share/
with the same layout (setup.py). KIMIDEPLOY_HOME points elsewhere when needed.
"""

from __future__ import annotations

import os
from pathlib import Path


def package_dir() -> Path:
    """The installed kimideploy package (its Python sources, what an image build copies)."""
    return Path(__file__).resolve().parent


def repository_root() -> Path:
    """The folder that holds templates/ and the example kimideploy.yaml: KIMIDEPLOY_HOME, else
    the checkout this package is installed editable from, else the wheel's copy."""
    override = os.environ.get("KIMIDEPLOY_HOME")
    if override:
        return Path(override)
    # Only the checkout this package is the source of (src/kimideploy is this very folder): a
    # wheel installed with `pip install --target` inside some repository must not take that
    # repository's templates and example for its own.
    checkout = package_dir().parents[1]
    own_source = (checkout / "src" / "kimideploy").resolve() == package_dir().resolve()
    if (
        own_source
        and (checkout / "templates").is_dir()
        and (checkout / "kimideploy.yaml").is_file()
    ):
        return checkout
    return package_dir() / "_share"


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
