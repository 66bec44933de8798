"""extract (reference path), vocab maps and `data inspect` on a tiny model made in the test."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kimideploy.cli.main import main
from kimideploy.config.drafters import to_vllm_layer_ids
from kimideploy.config.specs import ExtractSpec, LayerSelection, TargetRef, VocabSpec
from kimideploy.workloads.chat_format import render, text_of
from tests.conftest import REPO
from tests.workloads.conftest import run_workload

ANSWERS = [
    "the quick brown fox",
    "hello world how are you",
    "speculative decoding with eagle",
    "lazy dog",
]


def conversations(root: Path) -> Path:
    """Samples in datagen's output format (datagen itself is tested against a live server)."""
    shard = root / "shard-00000"
    shard.mkdir(parents=True)
    lines = []
    for i, answer in enumerate(ANSWERS):
        messages = [{"role": "user", "content": f"question {i}"}]
        segments = render(messages, "thinking about it", answer)
        lines.append(json.dumps({"id": f"s{i}", "prompt_index": i, "messages": messages, "segments": segments,
                                 "text": text_of(segments), "answer": answer, "reasoning": "thinking about it"}))  # fmt: skip
    (shard / "chunk-000001.jsonl").write_text("\n".join(lines) + "\n")
    return root


def target(model: Path) -> TargetRef:
    return TargetRef(repo="test/tiny", revision="1" * 40, served_name="tiny", path=str(model),
                     num_hidden_layers=4, hidden_size=64, vocab_size=333)  # fmt: skip


def extract_spec(
    tmp_path: Path, model: Path, ids: list[int], convention: str, **changes: Any
) -> Path:
    layers = LayerSelection(
        ids=ids, convention=convention, vllm_ids=to_vllm_layer_ids(ids, convention)
    )  # type: ignore[arg-type]
    values = {"run_id": "x", "cluster": "test", "shards": 1, "target": target(model),
              "conversations_dir": str(conversations(tmp_path / "conv")), "output_dir": str(tmp_path / "hs"),
              "layers": layers, "dtype": "float32", "backend": "transformers", "tensor_parallel_size": 1,
              "expected_bytes": 10_000_000, **changes}  # fmt: skip
    path = tmp_path / "extract.json"
    path.write_text(ExtractSpec(**values).model_dump_json())
    return path


COMPARE = """
import json, sys, torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
saved = load_file(sys.argv[1]); model = AutoModelForCausalLM.from_pretrained(sys.argv[2], torch_dtype=torch.float32)
entering_norm = []
model.model.norm.register_forward_hook(lambda m, i, o: entering_norm.append(i[0]))
with torch.no_grad():
    states = model(saved["input_ids"][None], output_hidden_states=True).hidden_states
def same(idx): return all(torch.equal(saved["aux_hidden_states"][i], states[p][0]) for i, p in enumerate(idx))
print(json.dumps({"declared": same(json.loads(sys.argv[3])), "other": same(json.loads(sys.argv[4])),
                  "final": torch.equal(saved["last_hidden_state"], entering_norm[0][0]),
                  "post_norm": torch.equal(saved["last_hidden_state"], states[-1][0]),
                  "mask": saved["loss_mask"].tolist(), "tokens": len(saved["input_ids"])}))
"""


def compare(
    python: Path, file: Path, model: Path, declared: list[int], other: list[int]
) -> dict[str, Any]:
    out = subprocess.run([str(python), "-c", COMPARE, str(file), str(model), json.dumps(declared), json.dumps(other)],
                         capture_output=True, text=True, check=True)  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize(("ids", "convention", "declared", "other"), [
    ([1, 2], "vllm", [1, 2], [2, 3]),      # vLLM id k = input of layer k = hidden_states[k]
    ([1, 2], "sglang", [2, 3], [1, 2]),    # SGLang id k = output of layer k = hidden_states[k+1]
])  # fmt: skip
def test_extraction_equals_a_forward_pass_in_the_declared_convention(
    tmp_path: Path, torch_python: Path, tiny_model: Path, ids: list[int], convention: str,
    declared: list[int], other: list[int],
) -> None:  # fmt: skip
    process = run_workload(
        "extract", extract_spec(tmp_path, tiny_model, ids, convention), python=str(torch_python)
    )
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    files = sorted((tmp_path / "hs/shard-00000").glob("*.safetensors"))
    assert len(files) == len(ANSWERS)
    result = compare(torch_python, files[0], tiny_model, declared, other)
    assert result["declared"] and not result["other"] and result["final"]
    assert not result[
        "post_norm"
    ]  # HF's last hidden state is after the norm; training wants before
    assert 0 < sum(result["mask"]) < result["tokens"]  # only the generated assistant tokens
    manifest = json.loads((tmp_path / "hs/shard-00000/manifest.json").read_text())
    assert manifest["convention"] == convention and manifest["layer_ids"] == ids
    assert manifest["vllm_layer_ids"] == to_vllm_layer_ids(ids, convention)  # type: ignore[arg-type]
    assert manifest["bytes_per_token_minimum"] == 3 * 64 * 4 and manifest["tokenizer_sha256"]
    final = [json.loads(line) for line in out.splitlines() if '"result"' in line][-1]
    assert final["tokens_per_s"] > 0 and final["mb_per_s"] > 0
    again = run_workload(
        "extract",
        extract_spec(tmp_path / "again", tiny_model, ids, convention),
        python=str(torch_python),
    )
    assert again.wait(timeout=300) == 0


def test_extraction_refuses_when_the_volume_cannot_hold_it(
    tmp_path: Path, torch_python: Path, tiny_model: Path
) -> None:
    spec = extract_spec(tmp_path, tiny_model, [1, 2], "vllm", expected_bytes=10**18)
    process = run_workload("extract", spec, python=str(torch_python))
    _, err = process.communicate(timeout=120)
    assert process.returncode == 2 and "grow the hidden-states claim" in err
    assert not list((tmp_path / "hs").rglob("*.safetensors"))


def test_data_inspect_names_a_truncated_file(
    tmp_path: Path, torch_python: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    process = run_workload(
        "extract", extract_spec(tmp_path, tiny_model, [1, 2], "vllm"), python=str(torch_python)
    )
    assert process.wait(timeout=300) == 0
    assert main(["data", "inspect", str(tmp_path / "hs"), "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (
        report["samples"] == len(ANSWERS)
        and report["convention"] == "vllm"
        and report["tokens"] > 0
    )
    victim = sorted((tmp_path / "hs").rglob("*.safetensors"))[1]
    victim.write_bytes(victim.read_bytes()[:-100])
    assert main(["data", "inspect", str(tmp_path / "hs")]) == 1
    out, err = capsys.readouterr()
    assert f"{victim}: truncated" in out and "corrupt or truncated" in err
    assert main(["data", "inspect", str(tmp_path / "conv")]) == 0
    assert "conversations" in capsys.readouterr().out


LOADER = """
import json, sys
from pathlib import Path
from kimideploy.workloads.vocab import load_vocab_maps
d2t, t2d = load_vocab_maps(Path(sys.argv[1]), 333)
print(json.dumps({"d2t": d2t.tolist(), "kept": t2d.nonzero().flatten().tolist()}))
"""


def test_vocab_maps_round_trip_through_the_loader(
    tmp_path: Path, torch_python: Path, tiny_model: Path
) -> None:
    spec = VocabSpec(run_id="v", cluster="test", target=target(tiny_model), conversations_dir=str(conversations(tmp_path / "conv")),
                     output_dir=str(tmp_path / "vocab"), draft_vocab_size=16)  # fmt: skip
    path = tmp_path / "vocab.json"
    path.write_text(spec.model_dump_json())
    process = run_workload("vocab", path, python=str(torch_python))
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    report = json.loads((tmp_path / "vocab/vocab.json").read_text())
    assert report["draft_vocab_size"] == 16 and 0 < report["coverage"] <= 1
    env = {"PYTHONPATH": str(REPO / "src")}
    out = subprocess.run([str(torch_python), "-c", LOADER, str(tmp_path / "vocab")], capture_output=True, text=True,
                         env={**__import__("os").environ, **env}, check=True).stdout  # fmt: skip
    maps = json.loads(out)
    assert len(maps["d2t"]) == 16
    assert [i + d for i, d in enumerate(maps["d2t"])] == maps["kept"]  # target = draft + d2t[draft]


def test_vocab_draft_selection_is_by_frequency() -> None:
    from collections import Counter

    from kimideploy.workloads.vocab import draft_vocabulary

    assert draft_vocabulary(Counter({7: 5, 3: 5, 9: 1, 4: 9}), 3, 20) == [3, 4, 7]
    assert draft_vocabulary(Counter({5: 2}), 3, 20) == [
        0,
        1,
        5,
    ]  # padded with the lowest unused ids
