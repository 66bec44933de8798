"""`image lock`: write a pushed digest into kimideploy.yaml, keeping the file's comments."""

from __future__ import annotations

import re
from pathlib import Path

from kimideploy.config.loading import load_project_text
from kimideploy.errors import UsageError


def lock_digest(config: Path, name: str, digest: str) -> str:
    """Replace images.<name>.digest in the file's text; validate before writing."""
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise UsageError(f"{digest!r} is not a sha256 digest")
    lines = config.read_text().splitlines(keepends=True)
    in_images, in_image, replaced = False, False, False
    for index, line in enumerate(lines):
        if re.match(r"^images:\s*(#.*)?$", line):
            in_images = True
            continue
        if in_images and re.match(r"^\S", line):
            break
        if in_images and re.match(rf"^  {re.escape(name)}:\s*(#.*)?$", line):
            in_image = True
            continue
        if in_image and re.match(r"^  \S", line):
            break
        match = re.match(r"^(    digest:\s*)(\S+)(.*)$", line) if in_image else None
        if match:
            comment = re.sub(r"#\s*EXAMPLE PIN\s*", "", match.group(3)).rstrip()
            lines[index] = f"{match.group(1)}{digest}{comment}\n"
            replaced = True
            break
    if not replaced:
        raise UsageError(f"no images.{name}.digest line in {config}", hint="add the image first")
    text = "".join(lines)
    load_project_text(text, config)  # never write a file that no longer validates
    config.write_text(text)
    return text
