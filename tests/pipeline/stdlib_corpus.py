"""The informative test target's text: conversations made from the Python standard library that
the running interpreter ships, so every machine that runs the tests has it without a download.

Why the standard library: it is real text written by people (code with its docstrings, and the
language reference's prose in `pydoc_data`), large enough (about 3.5 MB) that a tiny model cannot
memorise it, so the target's greedy answers carry real uncertainty and a drafter's acceptance
depends on how well it was trained, on the right features, for the right target. (The tier's
earlier target answered with a function of the prompt: every drafter, broken or not, reached an
acceptance length near the maximum.)

Two domains, so a drafter trained on one can be shown to serve the other worse:
- code: "Write the function `name` of `module`." -> thinking: the docstring's first paragraph;
  answer: the function's body;
- docs: "Explain ... from the Python documentation." -> thinking: a short restatement; answer: a
  paragraph of the language reference, a module's or a class's docstring.

Every item goes to one split by a hash of its key: `target` (what the target is trained on),
`prompts` (datagen's prompts: the drafter's training conversations) and `heldout` (what the bench
and the doctor ask: seen by neither the target's nor the drafter's training). Stdlib only: the
pipeline tests (kimideploy's venv) and make_target.py (the CPU vLLM venv) import it.
"""

from __future__ import annotations

import ast
import hashlib
import sysconfig
import textwrap
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

Domain = Literal["code", "docs"]
Split = Literal["target", "prompts", "heldout"]
SKIPPED = {"test", "idlelib", "tkinter", "lib2to3", "ensurepip", "site-packages", "turtledemo",
           "pydoc_data", "__pycache__", "distutils", "unittest"}  # fmt: skip
# Short answers: a tiny model trained for minutes on CPU degenerates into repetition loops on
# long greedy generations (every drafter then predicts the loop); short turns end with the end
# token before that, so what is drafted is real text.
MAX_CHARS = 200
REASONING_CHARS = 110


@dataclass(frozen=True)
class Item:
    key: str
    domain: Domain
    prompt: str
    reasoning: str
    answer: str

    @property
    def split(self) -> Split:
        bucket = int(hashlib.sha256(self.key.encode()).hexdigest()[:8], 16) % 100
        return "heldout" if bucket < 8 else "prompts" if bucket < 40 else "target"

    def conversation(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.prompt},
                {"role": "assistant", "content": self.answer,
                 "reasoning_content": self.reasoning}]  # fmt: skip


def _cut(text: str, limit: int = MAX_CHARS) -> str:
    """At most `limit` characters, cut at a line end, else a sentence end, else a word end."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    for mark in ("\n", ". ", " "):
        if mark in head:
            return head[: head.rfind(mark) + (1 if mark == ". " else 0)].rstrip()
    return head


def _first_paragraph(doc: str) -> str:
    return " ".join(doc.strip().split("\n\n")[0].split())


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if not set(p.relative_to(root).parts) & SKIPPED)


def _module_name(path: Path) -> str:
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _code_items(module: str, tree: ast.Module, lines: list[str]) -> list[Item]:
    items = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or len(node.body) < 2:
            continue
        doc = ast.get_docstring(node)
        if not doc or node.end_lineno is None:
            continue
        body = textwrap.dedent("\n".join(lines[node.body[1].lineno - 1 : node.end_lineno]))
        if not body.strip():
            continue
        # The answer starts with the def line, copied from the prompt's name: a real model's
        # answers depend on the prompt, and a drafter must follow that from the features.
        body = f"def {node.name}({ast.unparse(node.args)}):\n" + textwrap.indent(body, "    ")
        items.append(Item(f"code:{module}:{node.name}:{node.lineno}", "code",
                          f"Write the function `{node.name}` of `{module}`.",
                          _cut(_first_paragraph(doc), REASONING_CHARS), _cut(body)))  # fmt: skip
    return items


def _doc_items(module: str, tree: ast.Module) -> list[Item]:
    items = []
    doc = ast.get_docstring(tree)
    if doc and len(doc) > 200:
        items.append(Item(f"docs:{module}", "docs", f"Explain the module `{module}`.",
                          f"the user asks what {module} is for.",
                          _cut(_first_paragraph(doc))))  # fmt: skip
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            doc = ast.get_docstring(node)
            if doc and len(doc) > 120:
                items.append(Item(f"docs:{module}.{node.name}", "docs",
                                  f"Explain the class `{node.name}` of `{module}`.",
                                  f"the user asks about {node.name}.",
                                  _cut(_first_paragraph(doc))))  # fmt: skip
    return items


def _reference_items() -> list[Item]:
    """The language reference's help topics (pydoc_data), a paragraph group at a time."""
    from pydoc_data.topics import topics

    items = []
    for name in sorted(topics):
        paragraphs = [" ".join(p.split()) for p in topics[name].split("\n\n")
                      if len(p.strip()) > 80 and not p.startswith(" ")]  # fmt: skip
        for part in range(len(paragraphs)):
            text = _cut(paragraphs[part])
            items.append(Item(f"docs:topic:{name}:{part}", "docs",
                              f"Explain `{name}` from the Python reference (part {part + 1}).",
                              f"the user asks about {name}.", text))  # fmt: skip
    return items


@cache
def items() -> tuple[Item, ...]:
    """Every conversation the standard library gives, in a stable order."""
    found: list[Item] = []
    for path in _stdlib_files():
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        module = _module_name(path)
        found += _code_items(module, tree, text.splitlines())
        found += _doc_items(module, tree)
    found += _reference_items()
    unique = {item.key: item for item in found}
    return tuple(unique[key] for key in sorted(unique))


def select(split: Split, domain: Domain | None = None) -> list[Item]:
    return [i for i in items() if i.split == split and (domain is None or i.domain == domain)]


def corpus_digest() -> str:
    """What the target is built from: changes with the interpreter's standard library."""
    digest = hashlib.sha256()
    for item in items():
        digest.update(repr(item).encode())
    return digest.hexdigest()[:16]


def prompt_rows(split: Split, domain: Domain, count: int, offset: int = 0) -> list[dict[str, str]]:
    """`count` prompts of a split and domain, as datagen and the bench read them (JSON Lines rows
    with an id), in a stable order spread over the whole split; another `offset` (below the
    step) picks prompts the first did not."""
    chosen = select(split, domain)
    step = max(len(chosen) // count, 1)
    picked = chosen[offset::step][:count]
    if len(picked) < count:
        raise ValueError(f"only {len(chosen)} {domain} items in split {split}, {count} wanted")
    return [{"id": hashlib.sha256(i.key.encode()).hexdigest()[:16], "prompt": i.prompt}
            for i in picked]  # fmt: skip
