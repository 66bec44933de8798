"""extract (reference path), vocab maps and `data inspect` on a tiny model made in the test."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kimideploy.cli.main import main
from kimideploy.config.drafters import to_vllm_layer_ids
from kimideploy.config.specs import ExtractSpec, LayerSelection, TargetRef, VocabSpec
from kimideploy.formats.chat_template import SAMPLE_FORMAT
from kimideploy.workloads import dataset_record
from tests.conftest import REPO
from tests.workloads.conftest import run_workload

ANSWERS = [
    "the quick brown fox",
    "hello world how are you",
    "speculative decoding with eagle",
    "lazy dog",
]


TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def sample(i: int, answer: str) -> dict[str, Any]:
    """One of datagen's samples (datagen itself is tested against a live server): plain chats, a
    multi-turn one with earlier thinking, and one that declares a tool and calls it."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"question {i}"}]
    extra: dict[str, Any] = {"tools": None, "tool_calls": []}
    if i == 1:
        messages = [{"role": "user", "content": "hello"},
                    {"role": "assistant", "content": "hello world", "reasoning": "an old thought"},
                    *messages]  # fmt: skip
    if i == 2:
        call = {"id": "functions.lookup:0", "type": "function",
                "function": {"name": "lookup", "arguments": '{"q": "fox"}'}}  # fmt: skip
        extra = {"tools": TOOLS, "tool_calls": [call]}
    return {"format": SAMPLE_FORMAT, "id": f"s{i}", "prompt_index": i, "messages": messages,
            "answer": answer, "reasoning": "thinking about it", **extra}  # fmt: skip


def conversations(root: Path) -> Path:
    """Datagen's output: chunks of samples and the dataset's fingerprint."""
    dataset_record.claim(root, {"stage": "datagen", "test": "tiny"}, {"prompts_sha256": "x"})
    shard = root / "shard-00000"
    shard.mkdir(parents=True)
    lines = [json.dumps(sample(i, answer)) for i, answer in enumerate(ANSWERS)]
    (shard / "chunk-000001.jsonl").write_text("\n".join(lines) + "\n")
    return root


def target(model: Path) -> TargetRef:
    return TargetRef(repo="test/tiny", revision="1" * 40, served_name="tiny", path=str(model),
                     num_hidden_layers=4, hidden_size=64, vocab_size=333)  # fmt: skip


def features_fingerprint(layers: LayerSelection) -> dict[str, Any]:
    """What the plan would put in the spec (plan.data_layout.dataset_fingerprints), for the tiny model."""
    return {"stage": "extract", "layers": {"ids": layers.ids, "convention": layers.convention,
                                           "vllm_ids": layers.vllm_ids}, "dtype": "float32"}  # fmt: skip


def extract_spec(
    tmp_path: Path, model: Path, ids: list[int], convention: str, **changes: Any
) -> Path:
    layers = LayerSelection(
        ids=ids, convention=convention, vllm_ids=to_vllm_layer_ids(ids, convention)
    )  # type: ignore[arg-type]
    conv = tmp_path / "conv"
    if not (conv / "fingerprint.json").is_file():
        conversations(conv)
    values = {"run_id": "x", "cluster": "test", "shards": 1, "target": target(model),
              "conversations_dir": str(conv), "output_dir": str(tmp_path / "hs"),
              "layers": layers, "dtype": "float32", "backend": "transformers", "tensor_parallel_size": 1,
              "expected_bytes": 10_000_000, "fingerprint": features_fingerprint(layers), **changes}  # fmt: skip
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


def extract_and_inspect(
    tmp_path: Path, python: Path, model: Path, capsys: pytest.CaptureFixture[str]
) -> dict[str, Any]:
    """Extract the tiny conversations at vLLM ids [1, 2]; `data inspect -o json` of the result."""
    process = run_workload(
        "extract", extract_spec(tmp_path, model, [1, 2], "vllm"), python=str(python)
    )
    assert process.wait(timeout=300) == 0
    assert main(["data", "inspect", str(tmp_path / "hs"), "-o", "json"]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def test_data_inspect_names_a_truncated_file(
    tmp_path: Path, torch_python: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = extract_and_inspect(tmp_path, torch_python, tiny_model, capsys)
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


def test_a_rerun_with_other_layers_into_the_same_folder_is_refused_and_the_same_resumes(
    tmp_path: Path, torch_python: Path, tiny_model: Path
) -> None:
    """The plan gives other layers another folder (tests/unit); if a run is pointed at the old one
    anyway, it refuses instead of skipping the old samples and relabelling them."""
    first = run_workload("extract", extract_spec(tmp_path, tiny_model, [1, 2], "vllm"),
                         python=str(torch_python))  # fmt: skip
    assert first.wait(timeout=300) == 0
    files = {f: f.stat().st_mtime_ns for f in (tmp_path / "hs").rglob("*.safetensors")}
    manifest = (tmp_path / "hs/shard-00000/manifest.json").read_text()
    other = run_workload("extract", extract_spec(tmp_path, tiny_model, [2, 3], "vllm"),
                         python=str(torch_python))  # fmt: skip
    _, err = other.communicate(timeout=300)
    assert other.returncode == 2, err
    assert "fields.layers.vllm_ids: recorded [1, 2], now [2, 3]" in err
    assert (tmp_path / "hs/shard-00000/manifest.json").read_text() == manifest
    again = run_workload("extract", extract_spec(tmp_path, tiny_model, [1, 2], "vllm"),
                         python=str(torch_python))  # fmt: skip
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0 and f"{len(files)} already extracted" in err, err
    assert {f: f.stat().st_mtime_ns for f in files} == files  # resumed: nothing rewritten
    # The same settings but the synced model's chat template changed: refused, nothing rewritten.
    changed = tmp_path / "changed-model"
    shutil.copytree(tiny_model, changed)
    template = changed / "chat_template.jinja"
    template.write_text(template.read_text().replace("created by Moonshot AI", "by Moonshot"))
    spec = json.loads((tmp_path / "extract.json").read_text())
    spec["target"]["path"] = str(changed)
    (tmp_path / "extract.json").write_text(json.dumps(spec))
    moved = run_workload("extract", tmp_path / "extract.json", python=str(torch_python))
    _, err = moved.communicate(timeout=300)
    assert moved.returncode == 2 and "observed.chat_template_sha256: recorded" in err, err
    assert {f: f.stat().st_mtime_ns for f in files} == files


def cli(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI with the workloads venv (rendering a sample needs transformers)."""
    return subprocess.run([str(python), "-m", "kimideploy", *args], capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
                          timeout=300)  # fmt: skip


def test_data_inspect_shows_the_fingerprint_and_one_sample_as_the_target_sees_it(
    tmp_path: Path, torch_python: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = extract_and_inspect(tmp_path, torch_python, tiny_model, capsys)
    recorded = json.loads((tmp_path / "hs/fingerprint.json").read_text())
    assert report["fingerprint"] == recorded["id"]
    assert (
        "layers.vllm_ids=[1, 2]" in report["made from"]
        and "chat_template_sha256=" in (report["made from"])
    )
    # A conversation, rendered with the target's template: the system turn and thinking visible.
    done = cli(torch_python, "data", "inspect", str(tmp_path / "conv"), "--sample", "2",
               "--model", str(tiny_model))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "You are Kimi, an AI assistant created by Moonshot AI." in done.stdout
    assert "[[trained]]<think>thinking about it</think>speculative decoding" in done.stdout
    assert "<|tool_call_begin|>functions.lookup:0" in done.stdout
    assert "<|im_end|>[[/trained]]" in done.stdout
    # The same sample's features: the same tokens and trained span, and the layers stored.
    shown = cli(torch_python, "data", "inspect", str(tmp_path / "hs"), "--sample", "2",
                "--model", str(tiny_model), "-o", "json")  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert view["sample"] == "2 of 4 (s2)"
    assert view["layers stored"].startswith("2 at [1, 2] (vllm convention; vLLM ids [1, 2])")
    text = done.stdout.split("text:\n", 1)[1].rstrip("\n")
    assert view["text"] == text
    # Without the model, the ids with the trained ones bracketed; a conversation needs the model.
    assert main(["data", "inspect", str(tmp_path / "hs"), "--sample", "0"]) == 0
    assert "token ids:" in capsys.readouterr().out
    assert main(["data", "inspect", str(tmp_path / "conv"), "--sample", "0"]) == 2
    assert "pass --model DIR" in capsys.readouterr().err
    assert main(["data", "inspect", str(tmp_path / "conv"), "--sample", "9"]) == 2
