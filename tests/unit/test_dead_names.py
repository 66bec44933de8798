"""No name is defined at the top of a module under src/ and used nowhere (src, tests, bench,
scripts, templates): a dead constant reads as a fact the code relies on, and the next person
keeps it true for nothing. Decorated functions (click commands, fixtures) are used by their
decorator and not counted."""

from __future__ import annotations

import ast
import re
from collections import Counter

from tests.conftest import REPO

WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def uses() -> Counter[str]:
    texts = [
        p.read_text(errors="replace")
        for d in ("src", "tests", "bench")
        for p in (REPO / d).rglob("*.py")
    ]
    texts += [p.read_text(errors="replace") for p in (REPO / "scripts").rglob("*") if p.is_file()]
    texts += [p.read_text() for p in (REPO / "templates").rglob("*.j2")]
    return Counter(WORD.findall("\n".join(texts)))


def top_level_names(tree: ast.Module) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if not node.decorator_list:
                found.append((node.lineno, node.name))
        elif isinstance(node, ast.Assign):
            found += [(node.lineno, t.id) for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.append((node.lineno, node.target.id))
    return found


def test_every_top_level_name_in_src_is_used_somewhere() -> None:
    counted = uses()
    dead = [
        f"{path.relative_to(REPO)}:{line} {name}"
        for path in sorted((REPO / "src").rglob("*.py"))
        for line, name in top_level_names(ast.parse(path.read_text()))
        if counted[name] <= 1 and name != "__all__"
    ]
    assert dead == [], "defined and used nowhere (remove them):\n" + "\n".join(dead)
