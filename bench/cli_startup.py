"""CLI start-up: `kimideploy --help` and `render serve` against a bare interpreter, side by side.

Run: .venv/bin/python bench/cli_startup.py [--runs N]. Prints the median wall and CPU (user +
system) time of each command and their ratios to `python -c pass` measured in the same interleaved
run (this machine is noisy, so ratios are the figure to quote). Targets: `--help` within
3.5x (it is served from the help cache) and `render serve --drafter v3` at or below 25x of the
bare interpreter's CPU time (the libraries it must import are 13-14x by themselves: the floor
line). Measure idle: under load the collector and the imports slow down more than the bare
interpreter does, and the ratios swing by several points.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The console script users type (not `python -m kimideploy`, which adds runpy's import).
KIMIDEPLOY = [str(Path(sys.executable).with_name("kimideploy"))]
# pydantic's public switch stays in both: only the private stub and the collector window go.
_MAIN = (
    "import os, sys; os.environ.setdefault('PYDANTIC_DISABLE_PLUGINS', '__all__'); "
    "sys.argv[0] = 'kimideploy'; from kimideploy.cli.main import main; "
)
UNTUNED = [sys.executable, "-c", _MAIN + "sys.exit(main())"]
UNTUNED_NO_STUB = [
    sys.executable,
    "-c",
    "from kimideploy.cli import start_up; start_up.begin(); " + _MAIN + "sys.exit(main())",
]
COMPLETE = [
    "env",
    "_KIMIDEPLOY_COMPLETE=bash_complete",
    "COMP_WORDS=kimideploy up serve --drafter ",
    "COMP_CWORD=4",
]
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -c 'import click'": [sys.executable, "-c", "import click"],
    # The floor under `render`: the libraries the house style makes it use (click for the CLI,
    # pydantic for the strict config, Jinja for the templates, PyYAML for both ends), none of ours.
    "import click, pydantic, jinja2, yaml": [
        sys.executable,
        "-c",
        "import click, jinja2, yaml; from pydantic import BaseModel, Field",
    ],
    "kimideploy --help": [*KIMIDEPLOY, "--help"],
    "kimideploy drafter list": [*KIMIDEPLOY, "drafter", "list"],
    "kimideploy render serve --drafter v3": [*KIMIDEPLOY, "render", "serve", "--drafter", "v3"],
    # The same command without the start-up tuning (kept only for a measured need):
    # without pydantic's loader stub; and without the stub and the collector window.
    "render, no loader stub": [*UNTUNED_NO_STUB, "render", "serve", "--drafter", "v3"],
    "render, neither": [*UNTUNED, "render", "serve", "--drafter", "v3"],
    # What a shell waits for on <TAB> after --drafter (the names come from the project file).
    "completion of --drafter": [*COMPLETE, *KIMIDEPLOY],
    "completion, neither": [*COMPLETE, *UNTUNED],
}


# As an installed CLI runs: with its bytecode cached. An editable install under
# PYTHONDONTWRITEBYTECODE (set on some CI machines) would compile every module on every start,
# which no user of a wheel (compiled at install) pays; the warm-up run below writes the cache.
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(command: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one run; CPU is the child's own user + system time."""
    start = time.perf_counter()
    child = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=CHILD_ENV
    )
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {child.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    walls: dict[str, list[float]] = {name: [] for name in COMMANDS}
    cpus: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for command in COMMANDS.values():  # warm-up: bytecode written, files in the page cache
        timed(command)
    for _ in range(runs):  # interleaved, so drift hits every command alike
        for name, command in COMMANDS.items():
            wall, cpu = timed(command)
            walls[name].append(wall)
            cpus[name].append(cpu)
    wall_base = statistics.median(walls["python -c pass"])
    cpu_base = statistics.median(cpus["python -c pass"])
    print(f"{'command':40} {'wall s':>7} {'x python':>9} {'CPU s':>7} {'x python':>9}")
    for name in COMMANDS:
        wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        print(f"{name:40} {wall:7.3f} {wall / wall_base:9.2f} {cpu:7.3f} {cpu / cpu_base:9.2f}")


if __name__ == "__main__":
    main()
