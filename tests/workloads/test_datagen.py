"""datagen against a real OpenAI-compatible server on CPU: chunks, kill and resume, manifest."""

from __future__ import annotations

import hashlib
import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.specs import DatagenSpec, TargetRef
from kimideploy.formats.chat_template import SAMPLE_FORMAT
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


def spec(
    tmp_path: Path, server: str, model: Path, keep_prompts: bool = False, **changes: Any
) -> Path:
    prompts = tmp_path / "prompts.jsonl"
    if not keep_prompts:
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


def test_samples_are_structure_and_the_dataset_keeps_its_fingerprint(
    tmp_path: Path, openai_server: str, tiny_model: Path
) -> None:
    """Structure for the target's own template (rendered in extraction and training), and a
    fingerprint that only a run with the same inputs may extend."""
    made_from = {"stage": "datagen", "shards": 1, "sampling": {"temperature": 0.7}}
    path = spec(tmp_path, openai_server, tiny_model, fingerprint=made_from)
    process = run_workload("datagen", path)
    process.communicate(timeout=300)
    sample = next(r for r in records(tmp_path / "out") if r["prompt_index"] == 0)
    assert sample["format"] == SAMPLE_FORMAT
    assert sample["messages"] == [{"role": "system", "content": "be brief"},
                                  {"role": "user", "content": "question 0 hello"}]  # fmt: skip
    assert "text" not in sample and "segments" not in sample  # no hand-rendered copy
    assert sample["answer"] and sample["tool_calls"] == []
    record = json.loads((tmp_path / "out/fingerprint.json").read_text())
    prompts_sha = hashlib.sha256((tmp_path / "prompts.jsonl").read_bytes()).hexdigest()
    assert record["fields"] == made_from and record["observed"] == {"prompts_sha256": prompts_sha}
    chunks = sorted((tmp_path / "out").rglob("chunk-*.jsonl"))
    # Other inputs into the same folder: refused, each differing field named, nothing written.
    other = spec(tmp_path, openai_server, tiny_model, fingerprint={**made_from, "shards": 2})
    process = run_workload("datagen", other)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 2, err
    assert "was made from other inputs" in err and "fields.shards: recorded 1, now 2" in err
    with (tmp_path / "prompts.jsonl").open("a") as prompts:  # the prompt file changed in place
        prompts.write(json.dumps({"prompt": "a new one"}) + "\n")
    process = run_workload("datagen", spec(tmp_path, openai_server, tiny_model,
                                           fingerprint=made_from, keep_prompts=True))  # fmt: skip
    _, err = process.communicate(timeout=120)
    assert process.returncode == 2 and "observed.prompts_sha256: recorded" in err, err
    assert sorted((tmp_path / "out").rglob("chunk-*.jsonl")) == chunks


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
