"""The Jinja environment: StrictUndefined, no autoescape, one `j` filter that writes JSON."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2


def to_json(value: Any) -> str:
    """JSON is valid YAML, so any value placed this way parses back exactly."""
    return json.dumps(value, ensure_ascii=False)


@lru_cache(maxsize=4)
def environment(templates: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["j"] = to_json
    return env
