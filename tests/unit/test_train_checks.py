"""The train workload's refusals, which run before any GPU time is spent (no torch needed)."""

from __future__ import annotations

from typing import Any

import pytest

from kimideploy.config.specs import LayerSelection, TargetRef, TrainSpec
from kimideploy.workloads.runtime import BadInputError
from kimideploy.workloads.train_data import check_dataset, epoch_order, steps_per_epoch

TARGET = TargetRef(repo="moonshotai/Kimi-K2.5", revision="a" * 40, served_name="kimi", path="/models/k",
                   num_hidden_layers=61, hidden_size=7168, vocab_size=163840)  # fmt: skip


def spec(ids: list[int], convention: str, vllm_ids: list[int], convert: bool = False) -> TrainSpec:
    return TrainSpec(
        run_id="r", cluster="b300", target=TARGET, drafter="v3", base_drafter_path=None,
        hidden_states_dir="/hs", vocab_dir="/v", checkpoint_dir="/c", output_dir="/o",
        layers=LayerSelection(ids=ids, convention=convention, vllm_ids=vllm_ids),  # type: ignore[arg-type]
        draft_vocab_size=32000, num_speculative_tokens=3, mode="offline", nodes=1, gpus_per_node=8,
        epochs=1, lr=1e-4, batch_size=1, max_seq_len=4096, checkpoint_every_steps=10,
        convert_layer_convention=convert,
    )  # fmt: skip


def manifest(**changes: Any) -> dict[str, Any]:
    return {"shard": 0, "layer_ids": [3, 31, 59], "convention": "vllm", "hidden_size": 7168,
            "model": {"repo": "moonshotai/Kimi-K2.5", "revision": "a" * 40}, **changes}  # fmt: skip


def test_the_teams_trap_sglang_features_for_a_vllm_drafter_needs_an_explicit_conversion() -> None:
    features = manifest(layer_ids=[2, 30, 58], convention="sglang")
    with pytest.raises(BadInputError, match=r"same layers \(\[3, 31, 59\] in vLLM's convention\)"):
        check_dataset([features], spec([3, 31, 59], "vllm", [3, 31, 59]))
    notes = check_dataset([features], spec([3, 31, 59], "vllm", [3, 31, 59], convert=True))
    assert "name the same layers" in notes[0]


def test_features_of_other_layers_another_revision_or_size_are_refused() -> None:
    wanted = spec([3, 31, 59], "vllm", [3, 31, 59])
    with pytest.raises(BadInputError, match="they are different layers"):
        check_dataset([manifest(layer_ids=[2, 30, 58])], wanted)
    with pytest.raises(BadInputError, match="a drafter must be trained on its own target"):
        check_dataset(
            [manifest(model={"repo": "moonshotai/Kimi-K2-Instruct", "revision": "b" * 40})], wanted
        )
    with pytest.raises(BadInputError, match="hidden size 4096 is not the target's 7168"):
        check_dataset([manifest(hidden_size=4096)], wanted)
    assert check_dataset([manifest(), manifest(shard=1)], wanted) == []


def test_each_rank_gets_the_same_number_of_distinct_samples_every_epoch() -> None:
    orders = [epoch_order(list(range(10)), seed=0, epoch=2, rank=r, world=3) for r in range(3)]
    assert [len(o) for o in orders] == [3, 3, 3]
    assert len({i for o in orders for i in o}) == 9
    everything = list(range(10))
    assert epoch_order(everything, 0, 2, 0, world=3) == orders[0]
    assert epoch_order(everything, 0, 3, 0, world=3) != orders[0]
    assert steps_per_epoch(10, 3, 2) == 1
