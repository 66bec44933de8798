"""Plain-text tables that read well in a terminal and in CI logs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

WIDE = "wide"
"""`-o wide`: every cell whole, however wide the table (as kubectl's)."""
MIN_COLUMN = 8
"""A column is never cut below this (or its header's width)."""
WHOLE_CELLS = "kimideploy.whole_cells"
"""Set in the click context's meta by `-o wide` (cli/options.py): one invocation's choice."""


def _whole() -> bool:
    import click

    context = click.get_current_context(silent=True)
    return bool(context is not None and context.meta.get(WHOLE_CELLS))


def format_table(rows: Sequence[dict[str, Any]], keep: Sequence[str] = ()) -> str:
    """Left-aligned columns under upper-case headers; '-' for missing values.

    Fitted to the terminal's width when stdout is a terminal ($COLUMNS, else its size): the widest
    columns are cut first (a cut cell ends in '~'); where that is not enough, columns are left
    out from the right, never the first nor those in `keep`; a last line says what was cut.
    `-o wide`, a pipe and a file get every column and every cell whole."""
    if not rows:
        return "(none)"
    headers = list(rows[0])
    limit = None if _whole() else _terminal_columns()
    hidden: list[str] = []
    while True:
        cells = [[_cell(row.get(h)) for h in headers] for row in rows]
        widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
        fitted = _fitted(headers, widths, limit) if limit is not None else widths
        droppable = [h for h in headers[1:] if h not in keep]
        if limit is None or _line_width(fitted) <= limit or not droppable:
            break
        hidden.insert(0, droppable[-1])
        headers.remove(droppable[-1])
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, fitted, strict=True)).rstrip()]
    lines += [
        "  ".join(_cut(c, w).ljust(w) for c, w in zip(r, fitted, strict=True)).rstrip()
        for r in cells
    ]
    if hidden or fitted != widths:
        more = f"{len(hidden)} more columns, " if hidden else ""
        lines.append(f"(-o wide: {more}every cell whole)")
    return "\n".join(lines)


def _line_width(widths: list[int]) -> int:
    return sum(widths) + 2 * (len(widths) - 1)


def _terminal_columns() -> int | None:
    """The width to fit to when stdout is a terminal ($COLUMNS, else the terminal's); None for
    a pipe or a file, whatever $COLUMNS says (CI runners and test harnesses export it)."""
    import os
    import sys

    try:
        if not sys.stdout.isatty():
            return None
        columns = os.environ.get("COLUMNS", "")
        if columns.isdigit() and int(columns) > 0:
            return int(columns)
        return os.get_terminal_size(sys.stdout.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return None


def _fitted(headers: list[str], widths: list[int], limit: int) -> list[int]:
    """Column widths whose line fits `limit`, narrowing the widest column one at a time."""
    fitted = list(widths)
    floors = [max(len(h), MIN_COLUMN) for h in headers]
    while _line_width(fitted) > limit:
        widest = max(range(len(fitted)), key=lambda i: fitted[i] - floors[i])
        if fitted[widest] <= floors[widest]:
            break  # every column at its floor: the table is as narrow as it gets
        fitted[widest] -= 1
    return fitted


def _cut(cell: str, width: int) -> str:
    return cell if len(cell) <= width else cell[: width - 1] + "~"


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
