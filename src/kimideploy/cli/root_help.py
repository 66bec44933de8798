"""`kimideploy --help` without importing click: the text click printed last time, kept on disk.

Importing click alone costs more than the start-up budget for `--help` (3.5x a bare `python -c
pass`; click measures 3.5-3.7x on this project's 2-core machine). The top-level help is a pure
function of cli/main.py (the commands' summaries, the global options), of errors.py (the exit
codes it ends with), of click (its formatting) and of the help width, so it is cached under the
cache root with exactly those as its first line: the size and mtime of cli/main.py, errors.py,
this file and click's package, kimideploy's version and the width. Any change to one of them
is a miss, and a miss goes through click, which writes the cache again. Only the bare
`kimideploy --help` / `-h` is served from here; every other argument list goes through click.

This module imports nothing but os and sys (pathlib alone would cost about 1x a bare interpreter,
hashlib and importlib.util as much): it runs before everything else.
"""

from __future__ import annotations

import os
import sys

from kimideploy import __version__

ROOT_HELP_ARGUMENTS = (["--help"], ["-h"])
MAX_HELP_WIDTH = 100
"""click's max_content_width for kimideploy's help (cli/main.py passes it to click)."""


def terminal_width(max_width: int = MAX_HELP_WIDTH) -> int:
    """The help width click would compute, without its `import shutil` (and shutil's bz2 and
    lzma): $COLUMNS first, then the terminal, else 80, as shutil does."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        found = int(columns)
    else:
        try:
            found = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            found = 80
    return max(min(found, max_width) - 2, 50)


def _stamp(path: str | None) -> str:
    if path is None:
        return "-"
    try:
        status = os.stat(path)
    except OSError:
        return "-"
    return f"{path}:{status.st_size}:{status.st_mtime_ns}"


def _click_origin() -> str | None:
    # The finders already loaded at start-up, as importlib.util.find_spec asks them.
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        spec = find_spec("click", None) if find_spec else None
        if spec is not None:
            return str(spec.origin)
    return None


def _cache_key(width: int) -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    package = os.path.dirname(here)
    sources = (
        os.path.join(here, "main.py"),
        os.path.join(package, "errors.py"),
        os.path.join(here, "root_help.py"),
        _click_origin(),
    )
    return "|".join((__version__, str(width), *(_stamp(source) for source in sources)))


def cache_file(width: int) -> str:
    """Where the help for this width is kept (its first line says for which sources): under
    paths.cache_root(), whose rule this repeats without pathlib (a test holds them together)."""
    root = os.environ.get(
        "KIMIDEPLOY_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "kimideploy")
    )
    return os.path.join(root, "help", f"root-{width}.txt")


def cached(width: int) -> str | None:
    """The help click printed for these sources and this width, or None."""
    try:
        with open(cache_file(width), encoding="utf-8") as kept:
            key, _, text = kept.read().partition("\n")
    except (OSError, ValueError):
        return None
    return text if key == _cache_key(width) and text else None


def keep(width: int, text: str) -> None:
    """Written whole or not at all (a killed run leaves no half file); a read-only cache only
    costs the next run the same import of click."""
    target = cache_file(width)
    partial = f"{target}.{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(partial, "w", encoding="utf-8") as out:
            out.write(f"{_cache_key(width)}\n{text}")
        os.replace(partial, target)
    except OSError:
        return
