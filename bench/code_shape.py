"""The shape figures of the house pass, measured on a source tree: how arguments travel, how often
code branches on a workload's name, how much of the CLI is typed `Any`.

Run: .venv/bin/python bench/code_shape.py [PATH ...] (default: src/kimideploy). Another project's
tree (lightkube, httpx, kopf...) can be measured the same way for comparison:
    .venv/bin/python bench/code_shape.py /path/to/httpx/httpx

Figures:
- functions with more than four parameters (self and cls not counted), and the share of them
  whose parameters past the fourth are keyword-only (`*` or `*args` before them);
- calls passing six or more positional arguments, per 1,000 calls;
- comparisons against a workload's name (`x == "serve"`, `x in ("train", "bench")`,
  `match` cases) under plan/, and where;
- annotations naming `Any` under cli/.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kimideploy.config.workload_names import WORKLOAD_NAMES  # noqa: E402


def python_files(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        found += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return found


def parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[int, int]:
    """(all parameters but self/cls, those that are keyword-only)."""
    args = function.args
    positional = [*args.posonlyargs, *args.args]
    if positional and positional[0].arg in ("self", "cls"):
        positional = positional[1:]
    return len(positional) + len(args.kwonlyargs), len(args.kwonlyargs)


def names_in(node: ast.AST) -> list[str]:
    values = []
    for part in ast.walk(node):
        if isinstance(part, ast.Constant) and isinstance(part.value, str):
            values.append(part.value)
    return values


def _names_a_workload(node: ast.Compare, workloads: set[str]) -> bool:
    equality = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)
    return any(isinstance(op, equality) for op in node.ops) and bool(
        set(names_in(node)) & workloads
    )


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or [ROOT / "src" / "kimideploy"]
    wide = keyword_only = calls = long_calls = 0
    branches: Counter[str] = Counter()
    any_in_cli = 0
    workloads = set(WORKLOAD_NAMES)
    for file in python_files(paths):
        tree = ast.parse(file.read_text(), str(file))
        in_plan = "plan" in file.parts
        in_cli = "cli" in file.parts
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                total, named = parameters(node)
                if total > 4:
                    wide += 1
                    keyword_only += named >= total - 4
            elif isinstance(node, ast.Call):
                calls += 1
                positional = [a for a in node.args if not isinstance(a, ast.Starred)]
                long_calls += len(positional) >= 6
            elif in_plan and isinstance(node, ast.Compare) and _names_a_workload(node, workloads):
                branches[f"{file.name}:{node.lineno}"] += 1
            elif (
                in_plan
                and isinstance(node, ast.match_case)
                and set(names_in(node.pattern)) & workloads
            ):
                branches[f"{file.name}:{node.pattern.lineno}"] += 1
            if in_cli and isinstance(node, ast.Name) and node.id == "Any":
                any_in_cli += 1
    share = keyword_only / wide if wide else 0.0
    print(f"functions with more than four parameters: {wide}, keyword-only past the fourth: "
          f"{keyword_only} ({share:.0%})")  # fmt: skip
    print(f"calls with six or more positional arguments: {long_calls} of {calls} "
          f"({1000 * long_calls / max(calls, 1):.1f} per 1,000)")  # fmt: skip
    print(f"workload-name comparisons under plan/: {sum(branches.values())}")
    by_file = Counter(where.split(":")[0] for where in branches.elements())
    for name, count in by_file.most_common():
        print(f"  {name}: {count}")
    print(f"`Any` under cli/: {any_in_cli}")
    fifth_pass(python_files(paths), workloads)
    return 0


def fifth_pass(files: list[Path], workloads: set[str]) -> None:
    """The fifth pass's figures: the largest modules, the largest fan-out (imports of
    the package's own modules), tables keyed by workload name, the longest click commands, and
    the formatter's and the type checker's escapes."""
    sizes, fan_out, tables, commands = Counter[str](), Counter[str](), [], Counter[str]()
    skips = ignores = 0
    for file in files:
        text = file.read_text()
        name = file.as_posix().split("kimideploy/", 1)[-1]
        sizes[name] = sum(1 for line in text.splitlines() if line.strip())
        skips += text.count("# fmt: skip")
        ignores += text.count("type: ignore")
        tree = ast.parse(text, str(file))
        own = {
            node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kimideploy")
        }
        fan_out[name] = len(own)
        for node in tree.body:
            value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
            if isinstance(value, ast.Dict) and value.keys:
                keys = {k.value for k in value.keys if isinstance(k, ast.Constant)}
                if len(keys) >= 2 and keys <= workloads:
                    tables.append(f"{name}:{node.lineno}")
            if (
                isinstance(node, ast.FunctionDef)
                and "cli/" in name
                and any(
                    isinstance(d, ast.Call) and getattr(d.func, "attr", "") == "command"
                    for d in node.decorator_list
                )
            ):
                commands[f"{name}:{node.name}"] = (node.end_lineno or node.lineno) - node.lineno
    print(f"non-blank lines: {sum(sizes.values())}; largest modules: "
          + ", ".join(f"{n} {c}" for n, c in sizes.most_common(4)))  # fmt: skip
    print("largest fan-out (own modules imported): "
          + ", ".join(f"{n} {c}" for n, c in fan_out.most_common(3)))  # fmt: skip
    print(f"tables keyed by workload name: {len(tables)} ({', '.join(tables)})")
    print("longest commands (lines): "
          + ", ".join(f"{n} {c}" for n, c in commands.most_common(4)))  # fmt: skip
    print(f"`# fmt: skip`: {skips}; `type: ignore`: {ignores}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
