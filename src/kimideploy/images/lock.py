"""`image lock`: write a pushed digest into kimideploy.yaml, changing nothing else in the file.

Through config/yaml_edit.py (shared with `drafter publish`): only the digest's characters change
(its quoting kept), and an `# EXAMPLE PIN` comment on its line goes, since the pin is then real.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from kimideploy.config import yaml_edit
from kimideploy.config.loading import load_project_text
from kimideploy.errors import UsageError


def lock_digest(config: Path, name: str, digest: str) -> str:
    """Replace images.<name>.digest in the file's text; validate before writing."""
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise UsageError(f"{digest!r} is not a sha256 digest")
    with yaml_edit.editing(config):
        return _lock_digest(config, name, digest)


def _lock_digest(config: Path, name: str, digest: str) -> str:
    text = config.read_text()
    try:
        text = yaml_edit.set_values(text, ("images", name), {"digest": digest})
    except yaml_edit.EditError as exc:
        raise UsageError(f"{exc} in {config}", hint="add the image first") from exc
    except yaml.YAMLError as exc:
        raise UsageError(f"{config} is not valid YAML: {exc}") from exc
    load_project_text(text, config)  # never write a file that no longer validates
    yaml_edit.replace_text(config, text)
    return text
