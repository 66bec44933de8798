"""The collector during the CLI's start: nothing collected until the project is loaded, then the
start-up objects frozen and the thresholds back (cli/start_up.py)."""

from __future__ import annotations

import ast
import gc
import json
import subprocess
import sys
from pathlib import Path

from kimideploy.cli import start_up

EXAMPLE = Path(__file__).resolve().parents[2] / "kimideploy.yaml"
MODEL_BASES = frozenset({"BaseModel", "StrictModel", "SpecModel"})

# As the console script runs: begin() before the heavy imports, then a whole `render serve`
# (whose project load ends start-up). Collections are counted on each side of end().
RENDER_AS_INSTALLED = """
import gc, json, sys
from kimideploy.cli import start_up
defaults = gc.get_threshold()
collections = {"start-up": 0, "after": 0}
phase = ["start-up"]
def count(stage, info):
    if stage == "start":
        collections[phase[0]] += 1
gc.callbacks.append(count)
original_end = start_up.end
def end():
    phase[0] = "after"
    original_end()
start_up.end = end
start_up.begin()
raised = gc.get_threshold()
from kimideploy.cli.main import main
status = main(["--config", sys.argv[1], "render", "serve", "--drafter", "v3"])
print(json.dumps({
    "status": status, "defaults": defaults, "raised": raised, "restored": gc.get_threshold(),
    "frozen": gc.get_freeze_count(), "collections": collections,
}), file=sys.stderr)
"""


def test_render_collects_nothing_until_its_project_is_loaded_then_freezes_what_start_up_built() -> (
    None
):
    result = subprocess.run(
        [sys.executable, "-c", RENDER_AS_INSTALLED, str(EXAMPLE)],
        capture_output=True,
        text=True,
        check=False,
    )
    facts = json.loads(result.stderr.strip().splitlines()[-1])
    assert facts["status"] == 0, result.stderr
    assert facts["raised"][0] == start_up.START_UP_THRESHOLD
    assert facts["raised"][1:] == facts["defaults"][1:]
    # If start-up outgrew the threshold (more models, a larger example), this says so.
    assert facts["collections"]["start-up"] == 0
    assert facts["restored"] == facts["defaults"]
    # Everything start-up built (tens of thousands of objects) is out of later collections' way.
    assert facts["frozen"] > 10_000


def test_end_without_begin_leaves_a_library_callers_collector_alone() -> None:
    before = (gc.get_threshold(), gc.get_freeze_count(), gc.isenabled())
    start_up.end()
    assert (gc.get_threshold(), gc.get_freeze_count(), gc.isenabled()) == before


def test_modules_of_config_models_keep_their_annotations_as_objects() -> None:
    """Under `from __future__ import annotations` pydantic compiles each field's annotation from
    its string when the class is built: about 400 compiles on every start of the CLI, measured at
    2% of `render serve`'s CPU time. A self-referring validator says `Self`."""
    source = Path(start_up.__file__).resolve().parents[1]
    offenders = []
    for module in sorted(source.rglob("*.py")):
        tree = ast.parse(module.read_text(encoding="utf-8"))
        builds_models = any(
            isinstance(node, ast.ClassDef)
            and any(isinstance(base, ast.Name) and base.id in MODEL_BASES for base in node.bases)
            for node in tree.body
        )
        postponed = any(
            isinstance(node, ast.ImportFrom) and node.module == "__future__" for node in tree.body
        )
        if builds_models and postponed:
            offenders.append(str(module.relative_to(source)))
    assert offenders == []
