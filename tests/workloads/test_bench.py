"""bench against a real OpenAI-compatible server on CPU: throughput, TTFT/TPOT, baseline speedup."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.specs import BenchSpec, TargetRef
from kimideploy.workloads.bench import make_prompts, percentile
from tests.workloads.conftest import run_workload


def bench_spec(tmp_path: Path, server: str, model: Path, name: str, **changes: Any) -> Path:
    target = TargetRef(repo="test/tiny", revision="0" * 40, served_name=str(model), path=str(model),
                       num_hidden_layers=4, hidden_size=64, vocab_size=333)  # fmt: skip
    values = {"run_id": name, "cluster": "test", "target": target, "endpoint": server,
              "metrics_url": f"{server}/metrics", "drafter": "none", "prompt_sets": ["chat", "reasoning"],
              "concurrency": [1, 2], "num_prompts": 3, "max_tokens": 12,
              "results_dir": str(tmp_path / name), **changes}  # fmt: skip
    path = tmp_path / f"{name}.json"
    path.write_text(BenchSpec(**values).model_dump_json())
    return path


KERNELS = "vLLM 0.32.0 on sm_120: target TRITON_MLA, CUDA graphs uniform_batch, int4 experts MARLIN"


def test_bench_measures_each_level_and_compares_with_a_baseline(
    tmp_path: Path, openai_server: str, tiny_model: Path
) -> None:
    process = run_workload("bench", bench_spec(tmp_path, openai_server, tiny_model, "base"))
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err
    base = json.loads((tmp_path / "base/result.json").read_text())
    levels = {(level["prompt_set"], level["concurrency"]): level for level in base["levels"]}
    assert set(levels) == {("chat", 1), ("chat", 2), ("reasoning", 1), ("reasoning", 2)}
    for level in levels.values():
        assert (
            level["failed"] == 0 and level["output_tokens"] > 0 and level["output_tokens_per_s"] > 0
        )
        assert level["ttft_p50_s"] > 0 and level["ttft_p99_s"] >= level["ttft_p50_s"]
        assert (
            level["metrics"] == "unavailable" and level["acceptance_rate"] is None
        )  # no /metrics here
    assert any(json.loads(line).get("event") == "result" for line in out.splitlines())
    # One progress event per level, each with the rate `run` keeps for the next estimate.
    progress = [e for e in map(json.loads, out.splitlines()) if e.get("event") == "progress"]
    assert [(e["done"], e["total"], e["unit"]) for e in progress] == [
        (n, 4, "levels") for n in (1, 2, 3, 4)
    ]
    assert all(e["rate"] > 0 for e in progress), progress
    spec = bench_spec(
        tmp_path,
        openai_server,
        tiny_model,
        "spec",
        baseline_path=str(tmp_path / "base/result.json"),
        kernels=KERNELS,
    )
    process = run_workload("bench", spec)
    _, err = process.communicate(timeout=600)
    assert process.returncode == 0, err
    written = json.loads((tmp_path / "spec/result.json").read_text())
    compared = written["levels"]
    assert all(level["speedup"] > 0 and level["baseline_tokens_per_s"] > 0 for level in compared)
    # What the figures were measured on travels with them; a run told nothing writes nothing.
    assert written["kernels"] == KERNELS and "kernels" not in base
    assert "speedup" in err


def test_prompt_sets_are_deterministic_and_percentiles_nearest_rank() -> None:
    assert make_prompts("reasoning", 5) == make_prompts("reasoning", 5)
    assert make_prompts("chat", 2) != make_prompts("reasoning", 2)
    assert (
        percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0 and percentile([1.0, 2.0, 3.0, 4.0], 99) == 4.0
    )
    assert percentile([], 50) is None


def test_an_unreachable_release_fails_the_run(tmp_path: Path, tiny_model: Path) -> None:
    from tests.workloads.conftest import free_port

    process = run_workload("bench", bench_spec(tmp_path, f"http://127.0.0.1:{free_port()}", tiny_model, "x",
                                               prompt_sets=["chat"], concurrency=[1]))  # fmt: skip
    process.communicate(timeout=120)
    assert process.returncode == 1
    result = json.loads((tmp_path / "x/result.json").read_text())
    assert result["levels"][0]["failed"] == 3 and result["levels"][0]["errors"]


def test_a_missing_baseline_fails_before_measuring(tmp_path: Path, tiny_model: Path) -> None:
    from tests.workloads.conftest import free_port

    spec = bench_spec(tmp_path, f"http://127.0.0.1:{free_port()}", tiny_model, "x",
                      baseline_path=str(tmp_path / "gone/result.json"))  # fmt: skip
    process = run_workload("bench", spec)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 2 and "cannot read the baseline result" in err
    assert not (tmp_path / "x").exists()  # nothing measured, nothing written


def test_a_prompt_file_is_a_named_prompt_set(tmp_path: Path, tiny_model: Path) -> None:
    from kimideploy.workloads.bench import spec_prompts

    rows = [{"prompt": "Write the function `dumps` of `json`."}, {"bad": 1},
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]},
            {"prompt": "third"}]  # fmt: skip
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = bench_spec(tmp_path, "http://127.0.0.1:1", tiny_model, "f", prompt_sets=["mine"],
                      prompt_files={"mine": str(tmp_path / "mine.jsonl")}, num_prompts=2)  # fmt: skip
    spec = BenchSpec.model_validate_json(path.read_text())
    assert spec_prompts(spec, "mine") == [
        [{"role": "user", "content": "Write the function `dumps` of `json`."}],
        [{"role": "user", "content": "hi"}],  # the last answer is what gets generated
    ]
    assert spec_prompts(spec, "chat") == make_prompts("chat", 2)
    gone = bench_spec(tmp_path, "http://127.0.0.1:1", tiny_model, "g", prompt_sets=["mine"],
                      prompt_files={"mine": str(tmp_path / "gone.jsonl")})  # fmt: skip
    process = run_workload("bench", gone)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 2 and "bench.prompt_files.mine: cannot read" in err


class LoopingServer(ThreadingHTTPServer):
    """Streams a fixed answer per request, as vLLM's chat endpoint streams: `loops` of every
    four requests repeat one phrase, the others are ordinary sentences. The bench's arithmetic on
    text is what is under test; a real model's loops are not reproducible on demand."""

    def __init__(self, loops: int) -> None:
        super().__init__(("127.0.0.1", 0), _Streaming)
        self.loops, self.served = loops, 0


class _Streaming(BaseHTTPRequestHandler):
    server: LoopingServer

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        looping = self.server.served % 4 < self.server.loops
        self.server.served += 1
        words = ("I will check it. " * 12 if looping else ORDINARY).split(" ")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for word in words:
            chunk = {"choices": [{"delta": {"content": word + " "}}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"choices": [], "usage": {"completion_tokens": len(words)}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

    def log_message(self, *_: Any) -> None:
        pass


ORDINARY = (
    "The cache keeps each page it read, so a second start reads from memory and not the disk; "
    "a limit below the checkpoint's size evicts pages before they are used again."
)


@pytest.mark.parametrize(("loops", "degenerate"), [(1, False), (2, True)])
def test_outputs_that_repeat_themselves_are_counted_and_the_gate_refuses_the_level(
    tmp_path: Path, tiny_model: Path, loops: int, degenerate: bool
) -> None:
    """One looping answer in four is measured and tolerated; two in four make the level
    degenerate, and the gate will not judge a drafter on it."""
    from kimideploy.formats.bench_result import BenchResult
    from kimideploy.services.gate.verdict import GateMeasurementError, check_measured

    server = LoopingServer(loops)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        spec = bench_spec(tmp_path, endpoint, tiny_model, "loop", prompt_sets=["chat"],
                          concurrency=[1], num_prompts=4)  # fmt: skip
        process = run_workload("bench", spec)
        _, err = process.communicate(timeout=120)
    finally:
        server.shutdown()
    assert process.returncode == 0, err
    result = BenchResult.from_dict(json.loads((tmp_path / "loop/result.json").read_text()))
    [level] = result.levels
    assert (level.judged_outputs, level.degenerate_outputs) == (4, loops)
    assert level.distinct_bigrams is not None and level.distinct_bigrams < 1.0
    assert level.degenerate == degenerate
    if degenerate:
        with pytest.raises(GateMeasurementError, match="2 of 4 outputs repeat themselves"):
            check_measured(result, [("chat", 1)], "drafter")
    else:
        check_measured(result, [("chat", 1)], "drafter")
