"""Dataset folders are named by what makes them (plan.data_layout.dataset_fingerprints): a changed layer
id, revision, sampling setting or shard layout gives a new folder, so no run reads, extends or
relabels another's data; the same inputs give the same folder, so a run resumes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.loading import LoadedProject, load_project
from kimideploy.config.specs import SPEC_FILE_NAME
from kimideploy.plan.model import PlanRequest
from kimideploy.services.rendering import render_workload
from tests.conftest import EXAMPLE

CLUSTER = "b200"  # offline training: it reads the extracted features (b300 trains online)


def spec_of(loaded: LoadedProject, workload: str, *overrides: str) -> dict[str, Any]:
    rendered = render_workload(loaded, PlanRequest(workload, CLUSTER, overrides=overrides))
    config_map = next(o for o in rendered.objects if o["kind"] == "ConfigMap")
    spec: dict[str, Any] = json.loads(config_map["data"][SPEC_FILE_NAME])
    return spec


def folders(loaded: LoadedProject, *overrides: str) -> dict[str, str]:
    datagen, extract = (
        spec_of(loaded, "datagen", *overrides),
        spec_of(loaded, "extract", *overrides),
    )
    vocab, train = spec_of(loaded, "vocab", *overrides), spec_of(loaded, "train", *overrides)
    # Every stage names the same folders for the same data.
    assert datagen["output_dir"] == extract["conversations_dir"] == vocab["conversations_dir"]
    assert extract["output_dir"] == train["hidden_states_dir"]
    assert vocab["output_dir"] == train["vocab_dir"]
    assert train["data_fingerprint"] == extract["fingerprint"]
    return {"conversations": datagen["output_dir"], "features": extract["output_dir"],
            "vocab": vocab["output_dir"]}  # fmt: skip


def test_the_same_inputs_name_the_same_folders_and_samples_only_add() -> None:
    example = load_project(EXAMPLE)
    base = folders(example)
    assert base == folders(load_project(EXAMPLE))
    assert folders(example, "datagen.samples=20000") == base  # more samples extend the folder
    assert base["features"].startswith("/hidden-states/v3/")


def test_other_layer_ids_make_new_features_from_the_same_conversations(
    edited_config: Callable[..., Path],
) -> None:
    base = folders(load_project(EXAMPLE))
    moved = folders(load_project(edited_config((
        "    aux_layer_ids: [2, 30, 58]     # vLLM's DeepSeek default (2, n//2, n-3) for n = 61",
        "    aux_layer_ids: [3, 31, 59]",
    ))))  # fmt: skip
    assert moved["conversations"] == base["conversations"]
    assert moved["features"] != base["features"]
    assert moved["vocab"] == base["vocab"]


def test_another_revision_sampling_or_shard_layout_makes_new_conversations(
    edited_config: Callable[..., Path],
) -> None:
    example = load_project(EXAMPLE)
    base = folders(example)
    for changed in (
        folders(example, "datagen.temperature=1.0"),
        folders(example, "datagen.shards=7"),
        # b200 serves the nvfp4 model variant: its revision is the one its data comes from.
        folders(load_project(edited_config((
            "    revision: 9a8b7c6d5e4f30211f0e9d8c7b6a594837261504",
            "    revision: 0a8b7c6d5e4f30211f0e9d8c7b6a594837261504",
        )))),
    ):  # fmt: skip
        assert changed["conversations"] != base["conversations"]
        assert changed["features"] != base["features"]  # features of other conversations
        assert changed["vocab"] != base["vocab"]
    assert folders(example, "extract.dtype=float16")["conversations"] == base["conversations"]
    assert folders(example, "extract.dtype=float16")["features"] != base["features"]


def test_the_plan_says_which_folders_a_run_reads_and_writes() -> None:
    example = load_project(EXAMPLE)
    rendered = render_workload(example, PlanRequest("extract", CLUSTER))
    facts = dict(rendered.plan.facts)
    spec = spec_of(example, "extract")
    assert facts["datasets"].startswith(
        f"reads {spec['conversations_dir']}; writes {spec['output_dir']}"
    )


def test_online_training_expects_the_conversations_fingerprint() -> None:
    example = load_project(EXAMPLE)
    datagen = render_workload(example, PlanRequest("datagen", "b300")).objects
    train = render_workload(example, PlanRequest("train", "b300")).objects

    def spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
        config_map = next(o for o in objects if o["kind"] == "ConfigMap")
        loaded: dict[str, Any] = json.loads(config_map["data"][SPEC_FILE_NAME])
        return loaded

    assert spec(train)["data_fingerprint"] == spec(datagen)["fingerprint"]
    assert spec(train)["online"]["conversations_dir"] == spec(datagen)["output_dir"]


def _claim(root: str, prompts: str, barrier: Any, results: Any) -> None:
    from kimideploy.workloads import dataset_record
    from kimideploy.workloads.runtime import BadInputError

    barrier.wait()
    try:
        dataset_record.claim(Path(root), {"stage": "datagen"}, {"prompts_sha256": prompts})
        results.put("won")
    except BadInputError:
        results.put("refused")


def test_two_first_writers_of_a_fingerprint_never_both_win(tmp_path: Path) -> None:
    """Two runs starting a fresh folder with different prompt files at the same moment: exactly
    one writes the fingerprint, the other compares and is refused (before: both won, 19 of 20)."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    for trial in range(20):
        barrier, results = context.Barrier(2), context.Queue()
        racers = [context.Process(target=_claim, args=(str(tmp_path / str(trial)), prompts,
                                                       barrier, results))
                  for prompts in ("a" * 64, "b" * 64)]  # fmt: skip
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join(timeout=30)
        assert sorted(results.get(timeout=5) for _ in racers) == ["refused", "won"], trial
        assert not [p for p in (tmp_path / str(trial)).iterdir() if p.name != "fingerprint.json"]


def test_a_corrupt_fingerprint_is_a_named_refusal(tmp_path: Path) -> None:
    from kimideploy.workloads import dataset_record
    from kimideploy.workloads.runtime import BadInputError

    (tmp_path / "fingerprint.json").write_text("{half")
    with pytest.raises(BadInputError, match="not valid JSON") as caught:
        dataset_record.claim(tmp_path, {"stage": "datagen"}, {})
    assert caught.value.exit_code == 2
    (tmp_path / "fingerprint.json").unlink()
    (tmp_path / "fingerprint.json").symlink_to("/dev/zero")
    with pytest.raises(BadInputError, match="is a symbolic link"):
        dataset_record.read(tmp_path)
