"""The one renderer (workloads/chat_template.py) on a Kimi-shaped template: the default system
turn, tool declarations and calls, earlier thinking dropped, and the loss mask on exactly the
generated turn. Token-for-token equality with vLLM's own rendering is in the pipeline tier."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.workloads.conftest import run_workload
from tests.workloads.test_extract_vocab_inspect import ANSWERS, extract_spec, sample

HERE = Path(__file__).resolve().parent


def rendered(python: Path, model: Path, samples: list[dict[str, Any]], where: Path) -> list[Any]:
    path = where / "samples.json"
    path.write_text(json.dumps(samples))
    done = subprocess.run([str(python), str(HERE / "render_samples.py"), str(model), str(path)],
                          capture_output=True, text=True, env={"PYTHONPATH": str(REPO / "src")},
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def samples(torch_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    where = tmp_path_factory.mktemp("render")
    return {r["id"]: r for r in rendered(torch_python, tiny_model, [sample(i, a) for i, a in
                                                                    enumerate(ANSWERS)], where)}  # fmt: skip


def test_the_loss_mask_is_exactly_the_generated_turn(samples: dict[str, Any]) -> None:
    plain = samples["s0"]
    assert plain["trained"] == f"<think>thinking about it</think>{ANSWERS[0]}<|im_end|>"
    # Context before the mask, the trained span after it: one boundary, at the generation prompt.
    mask = plain["mask"]
    assert mask == [0] * plain["prompt_tokens"] + [1] * (len(mask) - plain["prompt_tokens"])
    assert plain["text"].endswith(plain["trained"])


def test_the_template_adds_its_default_system_turn(samples: dict[str, Any]) -> None:
    assert samples["s0"]["text"].startswith(
        "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI."
        "<|im_end|><|im_user|>user<|im_middle|>question 0<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>"
    )


def test_earlier_thinking_is_dropped_and_the_generated_turn_keeps_its_own(
    samples: dict[str, Any],
) -> None:
    multi = samples["s1"]
    assert "an old thought" not in multi["text"]
    assert (
        "<|im_assistant|>assistant<|im_middle|><think></think>hello world<|im_end|>"
        in (multi["text"])
    )
    assert multi["trained"] == f"<think>thinking about it</think>{ANSWERS[1]}<|im_end|>"
    # vLLM hands the template an assistant's reasoning under both names.
    earlier = multi["prompt_messages"][1]
    assert earlier["reasoning"] == earlier["reasoning_content"] == "an old thought"


def test_tools_are_declared_and_the_generated_call_is_trained(samples: dict[str, Any]) -> None:
    tool = samples["s2"]
    assert tool["text"].startswith('<|im_system|>tool_declare<|im_middle|>[{"type": "function"')
    # Arguments as vLLM passes them: an object, not the JSON string of the OpenAI request.
    assert tool["trained"] == (
        f"<think>thinking about it</think>{ANSWERS[2]}<|tool_calls_section_begin|>"
        '<|tool_call_begin|>functions.lookup:0<|tool_call_argument_begin|>{"q": "fox"}'
        "<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
    )


def test_a_sample_from_the_hand_written_format_is_refused(
    torch_python: Path, tiny_model: Path, tmp_path: Path
) -> None:
    spec = extract_spec(tmp_path, tiny_model, [1, 2], "vllm")
    old = {"id": "old", "segments": [["<|im_user|>user<|im_middle|>hi<|im_end|>", False]]}
    (tmp_path / "conv/shard-00000/chunk-000001.jsonl").write_text(json.dumps(old) + "\n")
    process = run_workload("extract", spec, python=str(torch_python))
    _, err = process.communicate(timeout=300)
    assert process.returncode == 2, err
    assert "written by an older datagen" in err and "run datagen again" in err
    assert not list((tmp_path / "hs").rglob("*.safetensors"))
