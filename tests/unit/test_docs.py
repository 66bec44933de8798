"""The door: README's command list is the CLI's own, every link in the documentation leads to a
file of the repository, and no code or document cites one that is not there."""

from __future__ import annotations

import re
from pathlib import Path

import click

from kimideploy.cli.main import cli
from tests.conftest import REPO

DOCS = [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "bench" / "MEASUREMENTS.md",
        *sorted((REPO / "docs").rglob("*.md"))]  # fmt: skip
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def cli_commands() -> set[str]:
    ctx = click.Context(cli)
    found: set[str] = set()

    def walk(group: click.Group, prefix: tuple[str, ...]) -> None:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            if isinstance(command, click.Group):
                walk(command, (*prefix, name))
            elif command is not None and not command.hidden:
                found.add(" ".join((*prefix, name)))

    walk(cli, ())
    return found


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Commands", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `kimideploy ([a-z -]+)` \|", section, flags=re.MULTILINE)


def test_the_readme_lists_exactly_the_cli_commands_once_each() -> None:
    listed = readme_commands()
    assert len(listed) == len(set(listed)), "a command is listed twice"
    assert set(listed) == cli_commands(), (
        f"only in README: {sorted(set(listed) - cli_commands())}; "
        f"only in the CLI: {sorted(cli_commands() - set(listed))}"
    )


def test_the_readme_is_a_door_not_a_manual() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 160
    assert max(len(line) for line in text.splitlines()) <= 200
    # Nothing that rots: no commit hashes, no dated measurements (they live in bench/).
    assert not re.search(r"\b(?:commit )?[0-9a-f]{7,40}\b", text.replace("40-hex", ""))
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text)
    # The quick start is the user's: the test suite's timings are the contributors' (CONTRIBUTING).
    quick_start = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert not re.search(r"\d+(?:\.\d+)? (?:to [\d.]+ )?minutes", quick_start), quick_start


def test_every_relative_link_in_the_docs_leads_to_a_file() -> None:
    broken = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(REPO)} -> {target}")
    assert not broken, broken


def test_nothing_cites_a_document_outside_the_repository() -> None:
    cited = re.compile(
        r"CONTEXT §|ARCHITECTURE §|CONTEXT\.md|ARCHITECTURE\.md|NOTES\.md|\bissue \d+"
    )
    offenders = []
    for path in [*sorted((REPO / "src").rglob("*.py")), *sorted((REPO / "tests").rglob("*.py")),
                 *sorted((REPO / "bench").rglob("*.py")), *DOCS]:  # fmt: skip
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if cited.search(line) and path != Path(__file__):
                offenders.append(f"{path.relative_to(REPO)}:{number}")
    assert not offenders, offenders


def test_every_variable_the_code_reads_is_in_the_cli_reference() -> None:
    read = {
        name
        for source in (REPO / "src" / "kimideploy").rglob("*.py")
        for name in re.findall(r"\"(KIMIDEPLOY_[A-Z_]+)\"", source.read_text(encoding="utf-8"))
    }
    reference = (REPO / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    section = reference.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(KIMIDEPLOY_[A-Z_]+)`", section, re.MULTILINE))
    assert read == listed, (sorted(read - listed), sorted(listed - read))
