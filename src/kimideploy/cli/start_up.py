"""The cyclic garbage collector while the CLI starts: held back, then told to skip what it built.

Start-up (the libraries, kimideploy's config models and plan modules, the project's validation
schema) allocates objects that live as long as the process: classes, functions, schemas. With the
default thresholds the collector ran about 110 times during `render serve` and rescanned them each
time, for nothing: about 8% of the command's CPU time (bench/cli_startup.py). So the console
script raises the first threshold for the start, and once the project is loaded, everything alive
is frozen (moved where no collection looks again, which also keeps later collections of a long
`up` or `watch` small) and the default thresholds come back.

The threshold is raised, not the collector disabled: a command that never loads a project still
collects, every `START_UP_THRESHOLD` allocations, so nothing grows without bound. Only the console
script opens the window; a test or library calling `main()` keeps its own collector settings, and
`end()` changes nothing there.
"""

import gc

START_UP_THRESHOLD = 100_000
"""Net container allocations before a young collection during start-up: above what `render`
makes before its project is loaded (about 71,000 on the built-in example), so it collects none."""

_restore: tuple[int, int, int] | None = None


def begin() -> None:
    """Called by the console script before anything heavy is imported."""
    global _restore
    if _restore is None:
        _restore = gc.get_threshold()
        gc.set_threshold(START_UP_THRESHOLD, *_restore[1:])


def end() -> None:
    """Start-up is over (the project is loaded): freeze what it built, collect as usual again.
    The few cycles start-up left unreachable (measured: about 3,000 objects) are frozen with the
    rest; collecting them first would cost a full collection, most of what this saves."""
    global _restore
    if _restore is not None:
        gc.freeze()
        gc.set_threshold(*_restore)
        _restore = None
