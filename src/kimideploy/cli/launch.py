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
    # (Its loader module is still imported, with importlib.metadata: standing in for that
    # private module saved 0.03 s of render's 0.43 s, bench/cli_startup.py, and was dropped.)
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    from kimideploy.cli.main import main

    sys.exit(main())
