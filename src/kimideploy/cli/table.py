"""Plain-text tables that read well in a terminal and in CI logs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Left-aligned columns under upper-case headers; '-' for missing values."""
    if not rows:
        return "(none)"
    headers = list(rows[0])
    cells = [[_cell(row.get(h)) for h in headers] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


MACHINE_FORMATS = ("json", "yaml")
"""`-o json` and `-o yaml` carry the same document: what a script reads, stable across releases."""


def machine(document: Any, output: str) -> str | None:
    """The document as `-o json` or `-o yaml` prints it; None for the human forms."""
    if output == "json":
        import json

        return json.dumps(document, indent=2)
    if output == "yaml":
        import yaml

        return yaml.safe_dump(document, sort_keys=False, allow_unicode=True).rstrip("\n")
    return None
