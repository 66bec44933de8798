"""datagen against a real OpenAI-compatible server on CPU: chunks, kill and resume, manifest."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.specs import DatagenSpec, TargetRef
from tests.workloads.conftest import run_workload

GOOD = 12


def write_prompts(path: Path) -> None:
    rows: list[str] = []
    for i in range(GOOD):
        if i % 3 == 0:
            rows.append(json.dumps({"conversations": [{"from": "system", "value": "be brief"},
                                                      {"from": "human", "value": f"question {i} hello"},
                                                      {"from": "gpt", "value": "old answer"}]}))  # fmt: skip
        else:
            rows.append(json.dumps({"prompt": f"the quick brown fox {i}"}))
    rows += ["", "{not json", json.dumps({"prompt": "   "})]
    path.write_text("\n".join(rows) + "\n")


def spec(tmp_path: Path, server: str, model: Path, **changes: Any) -> Path:
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts)
    target = TargetRef(repo="test/tiny", revision="0" * 40, served_name=str(model), path=str(model),
                       num_hidden_layers=4, hidden_size=64, vocab_size=333)  # fmt: skip
    values = {"run_id": "t1", "cluster": "test", "shards": 1, "target": target, "prompts": str(prompts),
              "output_dir": str(tmp_path / "out"), "samples": 100, "endpoint": server, "concurrency": 2,
              "max_tokens": 24, "temperature": 0.7, "top_p": 0.95, "request_timeout_s": 60,
              "max_retries": 2, "chunk_samples": 2, **changes}  # fmt: skip
    path = tmp_path / "spec.json"
    path.write_text(DatagenSpec(**values).model_dump_json())
    return path


def records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for chunk in sorted(out.glob("shard-*/chunk-*.jsonl"))
            for line in chunk.read_text().splitlines() if line]  # fmt: skip


def wait_for_chunks(out: Path, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(list(out.glob("shard-*/chunk-*.jsonl"))) >= count:
            return
        time.sleep(0.1)
    pytest.fail(f"fewer than {count} chunks after {timeout}s")


def test_kill_in_the_middle_then_resume_loses_and_duplicates_nothing(
    tmp_path: Path, openai_server: str, tiny_model: Path
) -> None:
    path = spec(tmp_path, openai_server, tiny_model)
    first = run_workload("datagen", path)
    wait_for_chunks(tmp_path / "out", 2)
    first.send_signal(signal.SIGKILL)  # a hard kill: no chance to flush
    first.wait()
    partial = records(tmp_path / "out")
    assert 0 < len(partial) < GOOD
    second = run_workload("datagen", path)
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    final = records(tmp_path / "out")
    counts = Counter(r["id"] for r in final)
    assert len(counts) == GOOD and max(counts.values()) == 1
    assert {r["id"] for r in partial} <= set(counts)
    manifest = json.loads((tmp_path / "out/shard-00000/manifest.json").read_text())
    assert manifest["samples"] == GOOD and manifest["bad_prompts"] == 3
    assert manifest["prompts"]["sha256"] and manifest["model"]["revision"] == "0" * 40
    assert any(e.get("event") == "result" for e in map(json.loads, out.splitlines()))
    assert any(json.loads(line).get("event") == "progress" for line in out.splitlines())


def test_sigterm_flushes_and_exits_75(tmp_path: Path, openai_server: str, tiny_model: Path) -> None:
    path = spec(tmp_path, openai_server, tiny_model, concurrency=1)
    process = run_workload("datagen", path)
    wait_for_chunks(tmp_path / "out", 1)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 75, err
    assert "a restart resumes" in err


def test_conversations_are_rendered_as_the_model_sees_them(
    tmp_path: Path, openai_server: str, tiny_model: Path
) -> None:
    path = spec(tmp_path, openai_server, tiny_model)
    process = run_workload("datagen", path)
    process.communicate(timeout=300)
    sample = next(r for r in records(tmp_path / "out") if r["prompt_index"] == 0)
    assert sample["text"].startswith("<|im_system|>system<|im_middle|>be brief<|im_end|>"
                                     "<|im_user|>user<|im_middle|>question 0 hello<|im_end|>"
                                     "<|im_assistant|>assistant<|im_middle|><think>")  # fmt: skip
    assert sample["text"].endswith(f"</think>{sample['answer']}<|im_end|>")
    assert "old answer" not in sample["text"]  # the last answer is regenerated


def test_an_unreachable_endpoint_counts_failures_and_fails_the_shard(
    tmp_path: Path, tiny_model: Path
) -> None:
    from tests.workloads.conftest import free_port

    path = spec(tmp_path, f"http://127.0.0.1:{free_port()}", tiny_model, max_retries=1)
    process = run_workload("datagen", path)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 1 and "giving up after 2 attempt(s)" in err


def test_no_usable_prompts_is_bad_input(tmp_path: Path, tiny_model: Path) -> None:
    path = spec(tmp_path, "http://127.0.0.1:9", tiny_model)
    (tmp_path / "prompts.jsonl").write_text("\n{broken\n")
    process = run_workload("datagen", path)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 2 and "no usable prompts" in err
