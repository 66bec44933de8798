"""Every command a message or hint quotes (`kimideploy COMMAND ... --option`) exists, and so does
each option it names on that command: collected from every string of the source, checked against
the CLI itself. `--help` lists the README's exit codes."""

from __future__ import annotations

import ast
import re

import click
import pytest

from kimideploy.cli.main import cli
from tests.conftest import REPO

QUOTED = re.compile(r"`kimideploy ([^`]+)`")
GLOBAL_OPTIONS = {"--config", "--debug", "--help", "-h", "--version"}


class Shape:
    """A command's options (and whether each takes a value) and how many positionals it takes."""

    def __init__(self, command: click.Command) -> None:
        self.flags = set(GLOBAL_OPTIONS)
        self.valued: set[str] = set()
        self.optional: dict[str, set[str]] = {}
        """Options whose value may be left out (`--dry-run[=server]`): the values they take."""
        self.positionals = 0
        for param in command.params:
            if isinstance(param, click.Argument):
                self.positionals += 1_000 if param.nargs == -1 else param.nargs
                continue
            names = {*param.opts, *param.secondary_opts}
            is_flag = isinstance(param, click.Option) and (param.is_flag or param.count)
            if isinstance(param, click.Option) and getattr(param, "_flag_needs_value", False):
                choices = getattr(param.type, "choices", ())
                self.optional.update({name: set(choices) for name in names})
            (self.flags if is_flag else self.valued).update(names)

    def problems(self, words: list[str]) -> list[str]:
        found, positionals, index, optional = [], 0, 0, False
        if words and ("|" in words[0] or words[0] in ("...", "…")):
            return []  # a group's synopsis (`bench list|report`), not one invocation
        while index < len(words):
            word = words[index].rstrip(",;.)")
            if word.startswith("[") or optional:  # a synopsis's [OPTIONAL PART]
                optional = not word.endswith("]")
                index += 1
                continue
            option = word.split("=")[0]
            if option.startswith("-") and option != "-":
                if option in self.optional:
                    following = words[index + 1] if index + 1 < len(words) else ""
                    index += 1 if following in self.optional[option] else 0
                elif option in self.valued and "=" not in word:
                    index += 1  # its value
                elif option not in self.flags and option not in self.valued:
                    found.append(f"no {option}")
            elif word not in ("...", "…"):
                positionals += 1
            index += 1
        if positionals > self.positionals:
            found.append(f"takes {self.positionals} argument(s), given {positionals}")
        return found


def _commands() -> dict[tuple[str, ...], Shape]:
    """Every command path and its shape."""
    found: dict[tuple[str, ...], Shape] = {}
    context = click.Context(cli)

    def walk(command: click.Command, path: tuple[str, ...]) -> None:
        found[path] = Shape(command)
        if isinstance(command, click.Group):
            for name in command.list_commands(context):
                sub = command.get_command(context, name)
                assert sub is not None
                walk(sub, (*path, name))

    walk(cli, ())
    return found


def _strings() -> list[tuple[str, int, str]]:
    """(file, line, text) of every string constant and f-string's literal parts in the source,
    adjacent literals joined as Python joins them."""
    out = []
    for path in sorted((REPO / "src" / "kimideploy").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.append((str(path.relative_to(REPO)), node.lineno, node.value))
            elif isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "X" for v in node.values)
                out.append((str(path.relative_to(REPO)), node.lineno, text))
    return out


def test_every_quoted_command_and_option_exists() -> None:
    commands = _commands()
    problems = []
    checked = 0
    for where, line, text in _strings():
        for quoted in QUOTED.findall(text):
            words = quoted.split(" | ")[0].split()  # what follows a pipe is another program
            path: tuple[str, ...] = ()
            while len(path) < len(words) and (*path, words[len(path)]) in commands:
                path = (*path, words[len(path)])
            if not path and words and not words[0].startswith("-"):
                problems.append(f"{where}:{line}: `kimideploy {quoted}` names no command")
                continue
            for problem in commands[path].problems(words[len(path) :]):
                problems.append(f"{where}:{line}: `kimideploy {quoted}`: {problem}")
            checked += 1
    assert checked > 50, checked  # the collection itself works
    assert not problems, "\n".join(problems)


def test_help_lists_the_readmes_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    from kimideploy.cli.main import main

    assert main(["--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    readme = (REPO / "docs" / "reference" / "cli.md").read_text()
    codes = re.findall(r"^\| (\d+) \| ([^|]+) \|$", readme, flags=re.MULTILINE)
    assert len(codes) >= 6, codes
    for code, _ in codes:
        assert re.search(rf"\b{code} ", help_text), f"--help leaves out exit code {code}"
