"""Layering (CONTRIBUTING.md, "Where things live") and the light CLI path, enforced on the source itself."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SRC = REPO / "src" / "kimideploy"
HEAVY = (
    "torch",
    "triton",
    "vllm",
    "transformers",
    "speculators",
    "kubernetes",
    "fabric",
    "paramiko",
)
KERNEL_MODULES = {"workloads/triton_kernel.py", "workloads/drafter_swap_engine.py"}
"""A Triton kernel is defined at module level (Triton reads the function's source and globals when
it compiles), so its module imports triton at the top; it is itself imported only inside the
function that launches it, which the contract checks like any heavy import. The drafter-swap
engine subclasses vLLM's weight-transfer base class, so it imports vLLM at the top; only vLLM's
factory imports it, by the name workloads/drafter_swap.register gives it, inside a vLLM worker."""

# package -> the kimideploy packages it may import (besides itself, errors and paths). Every
# module lives in a package: a new top-level module fails test_every_module_lives_in_a_package.
ALLOWED = {
    "formats": set(),
    "config": set(),
    "plan": {"config", "formats"},
    "render": {"config", "plan"},
    "cluster": {"config", "plan", "formats"},
    "images": {"config", "plan", "render", "remote", "formats"},
    "remote": {"config"},
    "provision": {"config"},
    "services": {
        "config",
        "plan",
        "render",
        "cluster",
        "images",
        "remote",
        "provision",
        "formats",
    },
    "cli": {"services", "config", "plan"},
    "workloads": {"config", "formats"},
}
ANYWHERE = {"errors", "paths", "__init__", "__version__"}
# services/<use case>/ -> the other use cases it builds on; the modules directly in services/
# (rendering, reporting, preflight, connection) are shared by all.
SERVICE_ROOMS = {
    "release": {"runs"},
    "gate": {"release", "runs"},
    "calibrate": {"gate", "release"},
    "runs": set(),
    "hosts": {"runs"},
    "images": set(),
    "drafters": {"runs"},
    "data": {"runs"},
}
# third-party modules confined to one package
CONFINED = {
    "click": "cli",
    "kubernetes": "cluster",
    "fabric": "remote",
    "invoke": "remote",
}
MODULES = sorted(SRC.rglob("*.py"))


def imports_of(path: Path) -> list[tuple[str, bool]]:
    """(module, at_top_level) for every import in a file."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, id(node) in top))
    return found


def package_of(path: Path) -> str:
    rel = path.relative_to(SRC).parts
    return rel[0] if len(rel) > 1 else ""


def service_room_of(path: Path) -> str | None:
    rel = path.relative_to(SRC).parts
    return rel[1] if rel[0] == "services" and len(rel) > 2 else None


def module_path(module: str) -> Path | None:
    base = SRC.parent / module.replace(".", "/")
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def test_every_module_lives_in_a_package() -> None:
    loose = {p.name for p in SRC.glob("*.py")} - {
        "__init__.py",
        "__main__.py",
        "errors.py",
        "paths.py",
    }
    assert not loose, f"modules outside a package: {sorted(loose)}"
    assert {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(
        ALLOWED
    )


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_layering(path: Path) -> None:
    package = package_of(path)
    for module, _ in imports_of(path):
        parts = module.split(".")
        if parts[0] == "kimideploy" and len(parts) > 1 and package in ALLOWED:
            target = parts[1]
            if target == "workloads" and package != "workloads":
                pytest.fail(f"{path}: nothing imports kimideploy.workloads")
            allowed = ALLOWED[package] | {package} | ANYWHERE
            assert target in allowed, f"{path}: {package} -> {target}"
        owner = CONFINED.get(parts[0])
        if owner is not None:
            assert package == owner, f"{path}: {parts[0]} may only be imported in {owner}/"


@pytest.mark.parametrize(
    "path", [p for p in MODULES if service_room_of(p)], ids=lambda p: str(p.relative_to(SRC))
)
def test_services_rooms(path: Path) -> None:
    room = service_room_of(path)
    assert room in SERVICE_ROOMS, f"{path}: services/{room}/ is not in SERVICE_ROOMS"
    for module, _ in imports_of(path):
        target = _service_room_imported(module)
        if target is not None:
            assert target in SERVICE_ROOMS[room] | {room}, f"{path}: {room} -> {target}"


def _service_room_imported(module: str) -> str | None:
    """The services/ room a module path reaches (`kimideploy.services.runs` and
    `kimideploy.services.runs.batch_runs` alike), None for the shared modules and the rest."""
    parts = module.split(".")
    if parts[:2] != ["kimideploy", "services"] or len(parts) < 3:
        return None
    return parts[2] if (SRC / "services" / parts[2] / "__init__.py").exists() else None


def used_arrows() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """What the source imports: package -> packages, services room -> rooms."""
    packages: dict[str, set[str]] = {package: set() for package in ALLOWED}
    rooms: dict[str, set[str]] = {room: set() for room in SERVICE_ROOMS}
    for path in MODULES:
        package, room = package_of(path), service_room_of(path)
        for module, _ in imports_of(path):
            parts = module.split(".")
            ours = package and parts[0] == "kimideploy" and len(parts) > 1
            if ours and parts[1] not in ANYWHERE | {package}:
                packages[package].add(parts[1])
            target = _service_room_imported(module)
            if room and target and target != room:
                rooms[room].add(target)
    return packages, rooms


def directions_text() -> str:
    """CONTRIBUTING.md's import-direction block, from ALLOWED and SERVICE_ROOMS."""
    # Top-down: the packages that import most come first; the services rooms likewise.
    order = sorted(ALLOWED, key=lambda p: (-len(ALLOWED[p]), p))
    lines = [f"    {p:<10} -> {', '.join(sorted(ALLOWED[p])) or 'nothing'}" for p in order]
    rooms = sorted(SERVICE_ROOMS, key=lambda r: (-len(SERVICE_ROOMS[r]), r))
    lines += [
        f"    {'services/' + r:<18} -> {', '.join(sorted(SERVICE_ROOMS[r])) or 'nothing'}"
        for r in rooms
    ]
    return "\n".join(lines)


def test_every_allowed_arrow_is_used_and_contributing_lists_exactly_them() -> None:
    """The map a newcomer reads is the contract, and the contract is what the code does: an arrow
    no import uses is taken out of both."""
    packages, rooms = used_arrows()
    unused = {p: sorted(ALLOWED[p] - packages[p]) for p in ALLOWED if ALLOWED[p] - packages[p]}
    unused |= {
        f"services/{r}": sorted(SERVICE_ROOMS[r] - rooms[r])
        for r in SERVICE_ROOMS
        if SERVICE_ROOMS[r] - rooms[r]
    }
    assert not unused, f"allowed imports that nothing uses (take them out): {unused}"
    text = (REPO / "CONTRIBUTING.md").read_text()
    begin = "<!-- import directions: tests/unit/test_import_contract.py -->\n"
    block = text.split(begin, 1)[1].split("\n<!-- end of import directions -->", 1)[0]
    assert block == directions_text(), (
        f"CONTRIBUTING.md's import directions should read:\n{directions_text()}"
    )


def test_the_map_names_every_room_and_only_files_that_exist() -> None:
    """ "Where things live" names every package, every services/ room and shared module, and
    every file it names exists where it says."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    map_text = text.split("## Where things live", 1)[1].split("Import directions,", 1)[0]
    packages = [p.name for p in SRC.iterdir() if (p / "__init__.py").exists()]
    missing = [f"{p}/" for p in packages if f"      {p}/" not in map_text]
    services = SRC / "services"
    missing += [
        f"services/{p.name}/"
        for p in services.iterdir()
        if (p / "__init__.py").exists() and f"{p.name}/" not in map_text
    ]
    missing += [
        f"services/{p.stem}"
        for p in services.glob("*.py")
        if p.stem != "__init__" and p.stem not in map_text
    ]
    assert not missing, f"CONTRIBUTING.md's map does not name: {missing}"
    named = set(re.findall(r"\b([a-z_]+\.py)\b", map_text))
    existing = {p.name for p in SRC.rglob("*.py")}
    assert named <= existing, f"the map names files that do not exist: {sorted(named - existing)}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_imports_inside_functions_only_defer_heavy_libraries(path: Path) -> None:
    """A function-level import is for start-up time (a heavy library, or in cli/ a command's own
    service), never to hide a cycle: a cycle means a module is in the wrong room."""
    package = package_of(path)
    for module, at_top in imports_of(path):
        if at_top:
            continue
        parts = module.split(".")
        if parts[0] in HEAVY:
            continue
        if parts[0] != "kimideploy":
            continue  # light stdlib/third-party imports inside a function are a style choice
        if package == "cli":
            continue  # the CLI loads a command's services only when that command runs
        target = module_path(module)
        assert target is not None, f"{path}: imports {module}, which does not exist"
        heavy = {m.split(".")[0] for m, top in imports_of(target) if top} & set(HEAVY)
        assert heavy, f"{path}: imports {module} inside a function, and it is not heavy"


@pytest.mark.parametrize(
    "path",
    [p for p in MODULES if package_of(p) == "workloads"],
    ids=lambda p: str(p.relative_to(SRC)),
)
def test_workloads_import_heavy_libraries_inside_functions(path: Path) -> None:
    if str(path.relative_to(SRC)) in KERNEL_MODULES:
        return
    for module, at_top in imports_of(path):
        if module.split(".")[0] in HEAVY:
            assert not at_top, f"{path}: import {module} inside functions in workloads/"


def loaded_modules(*args: str) -> set[str]:
    return {m.split(".")[0] for m in loaded_module_names(*args)}


def loaded_module_names(*args: str) -> set[str]:
    code = (
        "import sys, json\n"
        "from kimideploy.cli.main import main\n"
        f"code = main({list(args)!r})\n"
        "sys.stdout.flush()\n"
        "print('\\nMODULES=' + json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    line = next(x for x in result.stderr.splitlines() if x.startswith("MODULES="))
    return set(json.loads(line.removeprefix("MODULES=")))


@pytest.mark.parametrize("args", [("--help",), ("render", "serve", "--drafter", "v3")])
def test_cli_path_loads_no_heavy_library(args: tuple[str, ...]) -> None:
    loaded = loaded_modules(*args)
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_help_does_not_even_load_pydantic_or_jinja() -> None:
    loaded = loaded_modules("--help")
    assert not loaded & {"pydantic", "jinja2", "jsonschema", "yaml"}


def test_render_validates_without_the_jsonschema_package() -> None:
    """render/json_schema.py applies the schemas; importing jsonschema (with referencing, attrs
    and rpds) would cost more than the rest of `render` (the start-up budget, bench/cli_startup.py)."""
    loaded = loaded_modules("render", "serve", "--drafter", "v3")
    assert not loaded & {"jsonschema", "referencing", "rpds", "attrs", "kubernetes_validate"}


def test_render_loads_nothing_that_talks_to_a_cluster() -> None:
    """`render` is offline: the cluster client's modules and the runs' services (which build on
    it) cost start-up time it has no use for."""
    loaded = loaded_module_names("render", "serve", "--drafter", "v3")
    offline = sorted(
        m for m in loaded if m.startswith(("kimideploy.cluster", "kimideploy.services.runs"))
    )
    assert offline == [], offline
