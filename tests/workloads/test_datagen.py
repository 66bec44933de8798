"""datagen against a real OpenAI-compatible server on CPU: chunks, kill and resume, manifest."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import signal
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.specs import DatagenSpec, TargetRef
from kimideploy.formats.chat_template import SAMPLE_FORMAT
from tests.tmpfs import tmpfs
from tests.workloads.conftest import run_workload

GOOD = 12
FAST_TAKEOVER = {"KIMIDEPLOY_WRITER_STALE_S": "3"}
"""A dead writer's lock is taken over after 3 s of silence here (30 s in pods)."""


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


@contextlib.contextmanager
def paced_proxy(upstream: str, delay_s: float) -> Iterator[str]:
    """The same server, each request answered `delay_s` later (a busy target)."""

    class Paced(http.server.BaseHTTPRequestHandler):
        def forward(self) -> None:
            time.sleep(delay_s)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
            request = urllib.request.Request(upstream.rstrip("/") + self.path, data=body,
                                             method=self.command,
                                             headers={"Content-Type": "application/json"})  # fmt: skip
            try:
                with urllib.request.urlopen(request, timeout=120) as answer:
                    status, payload = answer.status, answer.read()
            except urllib.error.HTTPError as error:
                status, payload = error.code, error.read()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = forward  # noqa: N815 (http.server names its handlers so)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Paced)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


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
    # What a kill between write and rename leaves: the restart removes it once it holds the lock.
    leftover = tmp_path / "out/shard-00000/.chunk-000009.jsonl.tmp-99999"
    leftover.write_text('{"id": "half"')
    second = run_workload("datagen", path, **FAST_TAKEOVER)
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    assert "took over the lock of" in err and "whose heartbeat stopped" in err
    assert not leftover.exists() and ".chunk-000009.jsonl.tmp-99999" in err
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


def test_a_removed_chunk_is_made_again_without_overwriting_another(
    tmp_path: Path, openai_server: str, tiny_model: Path
) -> None:
    """What `data inspect` tells users to do with a damaged chunk: remove it and run again."""
    path = spec(tmp_path, openai_server, tiny_model)
    process = run_workload("datagen", path)
    process.communicate(timeout=300)
    shard = tmp_path / "out/shard-00000"
    chunks = sorted(c.name for c in shard.glob("chunk-*.jsonl"))
    assert len(chunks) == GOOD // 2
    (shard / chunks[1]).unlink()
    for _ in range(2):  # every later restart too
        process = run_workload("datagen", path)
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
    counts = Counter(r["id"] for r in records(tmp_path / "out"))
    assert len(counts) == GOOD and max(counts.values()) == 1
    after = sorted(c.name for c in shard.glob("chunk-*.jsonl"))
    assert after == sorted({*chunks} - {chunks[1]} | {f"chunk-{len(chunks) + 1:06d}.jsonl"})


def test_a_second_writer_of_the_same_shard_is_refused(
    tmp_path: Path, openai_server: str, tiny_model: Path
) -> None:
    """Ctrl-C detaches `run`; the Job keeps going. Running again must not write the same
    samples a second time: the second writer sees the first one's heartbeat and stops."""
    # The first writer's answers are paced (1 s each, 12 s in all) so that it is still writing
    # when the second one looks, however fast this machine's model answers; a 2 s staleness
    # makes its heartbeat beat every 0.5 s.
    with paced_proxy(openai_server, delay_s=1.0) as slow:
        path = spec(tmp_path, slow, tiny_model, concurrency=1)
        first = run_workload("datagen", path, KIMIDEPLOY_WRITER_STALE_S="2")
        wait_for_chunks(tmp_path / "out", 1)
        second = run_workload("datagen", path, KIMIDEPLOY_WRITER_STALE_S="2")
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2, err
        assert "is being written by" in err and "a second writer would duplicate samples" in err
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    counts = Counter(r["id"] for r in records(tmp_path / "out"))
    assert len(counts) == GOOD and max(counts.values()) == 1
    assert not (tmp_path / "out/shard-00000/.writer.lock").exists()  # released


def test_a_full_volume_is_reported_and_leaves_nothing_half_written(
    tmp_path: Path, openai_server: str, tiny_model: Path
) -> None:
    """A real small filesystem (tmpfs) that fills up: exit 1 naming the folder and the free
    space, no temporary file left, and a run on a bigger volume resumes."""
    import shutil

    with tmpfs(tmp_path / "small", "size=24k") as volume:
        path = spec(tmp_path, openai_server, tiny_model, output_dir=str(volume / "out"),
                    max_tokens=200, chunk_samples=6)  # fmt: skip
        process = run_workload("datagen", path)
        _, err = process.communicate(timeout=300)
        assert process.returncode == 1, err
        assert f"no space left in {volume}/out/shard-00000" in err and "bytes free" in err
        assert "nothing half-written was left" in err and "Traceback" not in err
        assert not [p for p in volume.rglob("*") if ".tmp-" in p.name]
        kept = sorted(volume.rglob("chunk-*.jsonl"))
        for chunk in kept:  # what is visible is whole: every line a sample
            assert all(json.loads(line)["id"] for line in chunk.read_text().splitlines())
        shutil.copytree(volume / "out", tmp_path / "out")
    process = run_workload("datagen", spec(tmp_path, openai_server, tiny_model, max_tokens=200,
                                           chunk_samples=6), **FAST_TAKEOVER)  # fmt: skip
    _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    assert len({r["id"] for r in records(tmp_path / "out")}) == GOOD


@contextlib.contextmanager
def streaming_stub(queue_s: float, gap_s: float, stall_after: int | None = None,
                   refuse: str | None = None) -> Iterator[str]:  # fmt: skip
    """An OpenAI-shaped streaming server: headers at once, the first chunk after `queue_s` (a
    request waiting in vLLM's queue), then one chunk every `gap_s`; `stall_after` chunks in, it
    goes silent; a prompt containing `refuse` gets HTTP 500."""

    class Stub(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            if refuse and refuse in json.dumps(body["messages"]):
                self.send_response(500)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.flush()
            time.sleep(queue_s)
            for number in range(6):
                if stall_after is not None and number == stall_after:
                    time.sleep(30)
                    return
                chunk = {"choices": [{"delta": {"content": f"w{number} "}, "finish_reason":
                                      "stop" if number == 5 else None}]}  # fmt: skip
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                time.sleep(gap_s)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_a_request_may_wait_long_for_its_first_token_but_not_between_tokens(
    tmp_path: Path, tiny_model: Path
) -> None:
    for name in ("queued", "stalled"):
        (tmp_path / name).mkdir()
    """The old 900 s timeout ran while a request waited in vLLM's queue: on b300, 4,096 requests
    against 256 sequences, the tail timed out, was retried five times and dropped. Now the wait
    for the first token has its own budget, and a stream that stalls after it fails fast."""
    with streaming_stub(queue_s=2.0, gap_s=0.2) as queued:
        path = spec(tmp_path / "queued", queued, tiny_model, request_timeout_s=10, token_timeout_s=1,
                    max_retries=0)  # fmt: skip
        process = run_workload("datagen", path)
        _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    assert {r["answer"] for r in records(tmp_path / "queued" / "out")} == {"w0 w1 w2 w3 w4 w5 "}
    with streaming_stub(queue_s=0.1, gap_s=0.1, stall_after=2) as stalling:
        path = spec(tmp_path / "stalled", stalling, tiny_model, request_timeout_s=10,
                    token_timeout_s=1, max_retries=0)  # fmt: skip
        process = run_workload("datagen", path)
        _, err = process.communicate(timeout=300)
    assert process.returncode == 1, err
    assert "no next chunk within 1 s" in err


def test_a_shard_that_drops_more_prompts_than_allowed_fails_instead_of_shrinking(
    tmp_path: Path, tiny_model: Path
) -> None:
    for name in ("strict", "lenient"):
        (tmp_path / name).mkdir()
    with streaming_stub(queue_s=0.0, gap_s=0.0, refuse="fox 4") as server:
        strict = spec(tmp_path / "strict", server, tiny_model, max_retries=0, max_failed_share=0.0)
        process = run_workload("datagen", strict)
        _, err = process.communicate(timeout=300)
        assert process.returncode == 1, err
        assert (
            "1 of 12 prompts failed after their retries (8.3%, above datagen.max_failed_share 0.0%)"
            in err
        )
        assert len(records(tmp_path / "strict" / "out")) == 11  # what was made is kept
        lenient = spec(
            tmp_path / "lenient", server, tiny_model, max_retries=0, max_failed_share=0.1
        )
        process = run_workload("datagen", lenient)
        _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
