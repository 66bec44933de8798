"""The console script: a bare `kimideploy --help` from the help cache, all else through click."""

from __future__ import annotations

import sys

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
    from kimideploy.cli.main import main

    sys.exit(main())
