"""The comment-preserving writer `image lock` and `drafter publish` share (config/yaml_edit.py),
and what `drafter publish` pins with it: only the lines it must change, a file that validates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kimideploy.config import yaml_edit
from kimideploy.config.loading import load_project
from kimideploy.errors import KimiDeployError
from kimideploy.services.drafters.publishing import pin_published
from tests.conftest import EXAMPLE

TEXT = """# header comment
top:
  # a comment inside
  name: old   # EXAMPLE PIN
  quoted: "keep"
  block:
    a: 1
    b: [2, 3]
  last: x

after: 1
"""


def changed_lines(before: str, after: str) -> list[str]:
    return [line for line in after.splitlines() if line not in before.splitlines()]


def test_a_scalar_is_replaced_in_place_and_its_placeholder_mark_dropped() -> None:
    after = yaml_edit.set_values(TEXT, ("top",), {"name": "new"})
    assert changed_lines(TEXT, after) == ["  name: new"]
    assert after.count("\n") == TEXT.count("\n")


def test_the_files_own_quoting_is_kept() -> None:
    after = yaml_edit.set_values(TEXT, ("top",), {"quoted": "other"})
    assert changed_lines(TEXT, after) == ['  quoted: "other"']


def test_a_block_value_becomes_one_flow_line_and_a_missing_key_is_added_last() -> None:
    after = yaml_edit.set_values(TEXT, ("top",), {"block": {"c": [1]}, "added": {"k": "v"}})
    assert yaml.safe_load(after)["top"] == {"name": "old", "quoted": "keep", "block": {"c": [1]},
                                             "last": "x", "added": {"k": "v"}}  # fmt: skip
    assert "# header comment" in after and "  # a comment inside" in after
    assert after.splitlines()[-3:] == ["  added: {k: v}", "", "after: 1"]


def test_a_new_entry_is_a_block_at_the_mappings_indentation() -> None:
    text = "things:\n  one:\n    a: 1\n\nother: 2\n"
    after = yaml_edit.add_entry(text, ("things",), "two", {"a": 2, "b": [1, 2]})
    assert after == "things:\n  one:\n    a: 1\n  two:\n    a: 2\n    b: [1, 2]\n\nother: 2\n"
    with pytest.raises(yaml_edit.EditError, match=r"things\.one exists already"):
        yaml_edit.add_entry(text, ("things",), "one", {"a": 3})


def test_paths_that_are_not_there_are_named() -> None:
    with pytest.raises(yaml_edit.EditError, match=r"no top\.nothing in the file"):
        yaml_edit.set_values(TEXT, ("top", "nothing"), {"a": 1})


RESULT: dict[str, Any] = {
    "reference": "registry.example:5000/kimideploy/drafters/v3@sha256:" + "ab" * 32,
    "files": {"config.json": "1" * 64, "model.safetensors": "2" * 64,
              "kimideploy-lineage.json": "3" * 64},
    "lineage": {"drafter": "v3", "run_id": "r7", "trained_for": "moonshotai/Kimi-K2.5",
                "eagle_aux_hidden_state_layer_ids": [2, 30, 58], "draft_vocab_size": 32000,
                "num_speculative_tokens": 3, "dataset": {"fingerprint": "0af4dd1abf4e"},
                "selected_checkpoint": {"step": 900},
                "held_out": {"depth": 3, "samples": 240,
                             "mean_acceptance_length": {"1": 1.7, "2": 2.1, "3": 2.4},
                             "by_k": {"3": {"acceptance_per_position": [0.7, 0.5, 0.4]}}}},
}  # fmt: skip


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "kimideploy.yaml"
    path.write_text(EXAMPLE.read_text())
    return path


def test_publish_pins_an_existing_drafter_changing_only_its_lines(config: Path) -> None:
    before = config.read_text()
    published = pin_published(config, "v3", RESULT)
    after = config.read_text()
    assert not published.created and published.held_out == {1: 1.7, 2: 2.1, 3: 2.4}
    v3 = load_project(config).project.drafters["v3"]
    assert v3.status == "trained" and v3.source.oci is not None
    assert v3.source.path == "drafters/v3"  # where it was trained: no run trains that name again
    assert v3.source.oci.digest == "sha256:" + "ab" * 32
    assert v3.sha256 == "2" * 64 and v3.held_out is not None and v3.held_out.step == 900
    assert len(changed_lines(before, after)) == 4  # source, status, sha256, held_out
    removed = [line for line in before.splitlines() if line not in after.splitlines()]
    assert removed == ["    source: {path: drafters/v3}", "    status: planned"]


def test_publish_makes_an_entry_from_the_lineage_when_the_config_has_none(config: Path) -> None:
    result = {**RESULT, "lineage": {**RESULT["lineage"], "drafter": "v9", "run_id": "r9"}}
    published = pin_published(config, "v9", result)
    v9 = load_project(config).project.drafters["v9"]
    assert published.created and v9.aux_layer_ids == [2, 30, 58]
    assert v9.layer_id_convention == "vllm" and v9.lineage.trained_for == "moonshotai/Kimi-K2.5"
    assert v9.source.oci is not None and v9.status == "trained"


def test_a_lineage_without_layers_writes_nothing(config: Path) -> None:
    before = config.read_text()
    lineage = {
        k: v for k, v in RESULT["lineage"].items() if k != "eagle_aux_hidden_state_layer_ids"
    }
    with pytest.raises(KimiDeployError, match="does not say its layers"):
        pin_published(config, "v9", {**RESULT, "lineage": lineage})
    assert config.read_text() == before


def test_a_result_that_would_not_validate_writes_nothing(config: Path) -> None:
    before = config.read_text()
    broken = {**RESULT, "reference": "registry.example/kimideploy/drafters/v3@sha256:short"}
    with pytest.raises(KimiDeployError):
        pin_published(config, "v3", broken)
    assert config.read_text() == before
    assert json.dumps(RESULT)  # the fixture itself is plain JSON, as the pod prints it


HOSTILE_VALUES = [
    'x"\nrogue: injected\nq: "',  # closes the file's quotes and adds keys
    "x'\nrogue: injected\nq: '",
    "x\u2028rogue: injected",  # YAML 1.1 line breaks a reader would break at
    "x\u0085rogue: injected",
    "x\u2029y\x1b]52;c;Zm9v\x07",
    'back\\slash and "quotes"',
]


@pytest.mark.parametrize("style", ['"', "'"])
@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_a_value_is_quoted_by_yaml_never_spliced_between_the_files_quotes(
    style: str, value: str
) -> None:
    text = TEXT.replace('quoted: "keep"', f"quoted: {style}keep{style}")
    after = yaml_edit.set_values(text, ("top",), {"quoted": value})
    read = yaml.safe_load(after)
    assert read["top"]["quoted"] == value and "rogue" not in read and "rogue" not in read["top"]
    assert after.count("\n") == text.count("\n")  # one line, as before
    assert [line for line in after.splitlines() if line.startswith("  quoted:")]


def test_publish_refuses_a_dataset_id_that_is_not_its_fingerprint(config: Path) -> None:
    from kimideploy.config.fingerprints import fingerprint_id
    from kimideploy.services.data.publishing import pin_dataset

    made_from = {"stage": "datagen", "target": {"repo": "m/k", "revision": "0" * 40}}
    honest = {"fingerprint": fingerprint_id(made_from), "made_from": made_from, "samples": 5}
    reference = "registry.example/k/datasets/chat@sha256:" + "ab" * 32
    before = config.read_text()
    crafted = dict(honest, fingerprint='x"\n  evil:\n    oci: {repository: attacker.example')
    with pytest.raises(KimiDeployError, match="is not the fingerprint of the fields"):
        pin_dataset(config, "chat", "b300", {"reference": reference, "dataset": crafted})
    with pytest.raises(KimiDeployError, match="is not the fingerprint of the fields"):
        pin_dataset(config, "chat", "b300", {"reference": reference,
                                             "dataset": dict(honest, made_from="text")})  # fmt: skip
    assert config.read_text() == before
    done = pin_dataset(config, "chat", "b300", {"reference": reference, "dataset": honest})
    assert done.fingerprint == honest["fingerprint"]
    assert load_project(config).project.datasets["chat"].fingerprint == honest["fingerprint"]
