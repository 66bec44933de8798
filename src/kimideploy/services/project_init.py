"""`kimideploy init [DIR]`: a project file for the user's own clusters, from the example.

The example is the one reviewed description of every cluster kind (the PCIe host, the rented
NVL8 clusters), so the new file is the example's text with the clusters the user did not choose
removed, comments kept: every placeholder pin stays marked `# EXAMPLE PIN` and the changing
commands refuse the file, naming each one, until it is replaced (config/placeholders.py).
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from kimideploy.config import yaml_edit
from kimideploy.config.loading import CONFIG_FILE_NAME, load_project, load_project_text
from kimideploy.config.placeholders import Placeholder, placeholders_in
from kimideploy.errors import UsageError
from kimideploy.paths import example_config_path

EXAMPLE_HEADER = re.compile(r"\A(?:#[^\n]*\n)+", re.MULTILINE)


@dataclass(frozen=True)
class InitResult:
    path: Path
    clusters: tuple[str, ...]
    placeholders: tuple[Placeholder, ...]


def example_clusters() -> dict[str, str]:
    """The cluster kinds the example describes: name -> its description."""
    project = load_project(example_config_path()).project
    return {name: cluster.description for name, cluster in project.clusters.items()}


def project_text(clusters: tuple[str, ...]) -> str:
    """The example with only `clusters` (the first is the default), headed for its new owner."""
    text = example_config_path().read_text(encoding="utf-8")
    known = example_clusters()
    unknown = [c for c in clusters if c not in known]
    if unknown or not clusters:
        raise UsageError(
            f"--cluster {', '.join(unknown) or '(none)'}: the example describes {', '.join(known)}",
            hint="pass --cluster once per cluster you run (e.g. --cluster rtx6000 --cluster "
            "b300); rename them in the file afterwards if you like",
        )
    for name in known:
        if name not in clusters:
            text = yaml_edit.remove_entry(text, ["clusters"], name)
    start, end = yaml_edit.scalar_span(text, ["default_cluster"])
    text = f"{text[:start]}{clusters[0]}{text[end:]}"
    header = (
        "# kimideploy.yaml: the whole EAGLE-3 lifecycle of one target model, on your clusters.\n"
        "# Written by `kimideploy init` from kimideploy's example. Values marked EXAMPLE PIN are\n"
        "# placeholders of the right shape: `up`, `run` and the other commands whose pods pull\n"
        "# what they name refuse this file, naming each, until you replace them (the revision\n"
        "# you validated, the digests `kimideploy image lock` writes). Lines marked EXAMPLE are\n"
        "# your hosts, addresses and fabric. Editors validate it with `kimideploy config schema`.\n"
    )
    return EXAMPLE_HEADER.sub(header, text, count=1)


def init_project(directory: Path, clusters: tuple[str, ...]) -> InitResult:
    """Write DIR/kimideploy.yaml; an existing file is never replaced."""
    path = directory / CONFIG_FILE_NAME
    if path.exists():
        raise UsageError(
            f"{path} exists: init never replaces a project file",
            hint="edit it, or init into another folder (kimideploy init DIR)",
        )
    text = project_text(clusters)
    load_project_text(text, path)  # what is written validates, or nothing is written
    directory.mkdir(parents=True, exist_ok=True)
    # Whole or not at all, and never over a file that appeared meanwhile: written beside it,
    # then hard-linked to its name (which fails if the name exists). The temporary file is
    # created exclusively under a name no one can guess: a link planted there is never written
    # through.
    partial = directory / f".{CONFIG_FILE_NAME}.{os.getpid()}.{secrets.token_hex(8)}.tmp"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    try:
        os.link(partial, path)
    except FileExistsError as exc:
        raise UsageError(f"{path} appeared while init wrote it; it was left alone") from exc
    finally:
        partial.unlink()
    return InitResult(path, clusters, tuple(placeholders_in(text)))
