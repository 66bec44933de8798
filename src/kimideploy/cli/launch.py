"""The console script: a bare `kimideploy --help` from the help cache, all else through click."""

from __future__ import annotations

import os
import sys

from kimideploy.cli import start_up
from kimideploy.cli.root_help import ROOT_HELP_ARGUMENTS, cached, keep, terminal_width


def entrypoint() -> None:
    if sys.argv[1:] in ROOT_HELP_ARGUMENTS:
        width = terminal_width()
        text = cached(width)
        if text is None:
            # click is imported here only: a hit never pays for it.
            from kimideploy.cli.main import root_help_text

            text = root_help_text()
            keep(width, text)
        sys.stdout.write(text)
        sys.stdout.flush()
        raise SystemExit(0)
    start_up.begin()
    # pydantic looks for plugins in every installed package's metadata on the first model it
    # builds; kimideploy's models use none, and the scan is a tenth of a render's start-up.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    if os.environ["PYDANTIC_DISABLE_PLUGINS"] == "__all__":
        _without_plugin_lookup()
    from kimideploy.cli.main import main

    sys.exit(main())


def _without_plugin_lookup() -> None:
    """With every plugin disabled, pydantic's plugin loader returns none, but importing it still
    imports importlib.metadata (and zipfile, csv, email with it): more than a tenth of `render`'s
    start-up, for nothing. Its one function, answering as the disabled loader does, stands in for
    it. A pydantic release that moves the loader leaves this entry unread and the start-up as it
    was (bench/cli_startup.py shows it); tests/unit/test_import_contract.py checks it is read."""
    import types

    loader = types.ModuleType("pydantic.plugin._loader")
    loader.get_plugins = tuple  # type: ignore[attr-defined]
    sys.modules.setdefault("pydantic.plugin._loader", loader)
