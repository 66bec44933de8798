"""The serve pod's capture sidecar (workloads/capture_proxy.py), as a process on the serve stack's
Python (aiohttp from vLLM's own requirements), in front of a server that answers as vLLM 0.32
does with --per-request-spec-decode-metrics (the acceptance on the final chunk): every byte
passes unchanged, and what is recorded is the conversation and the operator's allowed fields,
never the identities, within the daily cap and the retention."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.specs import CaptureSpec, ServeSpec, TargetRef
from kimideploy.workloads.capture_proxy import CaptureStore
from tests.workloads.conftest import free_port, run_workload, workloads_python

ACCEPTANCE = {
    "mean_acceptance_length": 3.1, "draft_acceptance_rate": 0.7, "acceptance_histogram": [1, 2, 3, 4],
    "num_spec_steps": 10, "num_accepted_draft_tokens": 21, "num_draft_tokens": 30, "num_spec_tokens": 3,
}  # fmt: skip
"""vLLM 0.32's SpeculativeDecodingMetrics (entrypoints/generate/base/protocol.py), summary level."""
SEEN_HEADERS: list[dict[str, str]] = []


class EngineLike(BaseHTTPRequestHandler):
    """Answers as vLLM's OpenAI server: a stream whose last chunk carries usage and the
    request's acceptance, a JSON completion, /metrics and /health."""

    def log_message(self, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        body = b"vllm:num_requests_running 0\n" if self.path == "/metrics" else b"ok"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        SEEN_HEADERS.append(dict(self.headers))
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/completions":
            body = json.dumps({"choices": [{"text": "42"}], "usage": {"completion_tokens": 1},
                               "metrics": {"speculative_decoding": ACCEPTANCE}}).encode()  # fmt: skip
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for word in ("one ", "two ", "three"):
            chunk = {"choices": [{"delta": {"content": word}}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        if request.get("stream_options"):
            final = {"choices": [], "usage": {"completion_tokens": 3},
                     "metrics": {"speculative_decoding": ACCEPTANCE}}  # fmt: skip
            self.wfile.write(f"data: {json.dumps(final)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture
def engine() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), EngineLike)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def serve_spec(tmp_path: Path, engine_port: int, listen_port: int, **capture: Any) -> Path:
    target = TargetRef(repo="test/tiny", revision="0" * 40, served_name="tiny", path="/m",
                       num_hidden_layers=4, hidden_size=64, vocab_size=333)  # fmt: skip
    values = {"directory": str(tmp_path / "capture"), "listen_port": listen_port,
              "engine_port": engine_port, "retention_days": 7, "max_prompts_per_day": 100,
              "sample_rate": 1.0, **capture}  # fmt: skip
    spec = ServeSpec(
        run_id="serve", cluster="test", target=target, drafter="v3", drafter_path="/d",
        layers=None, num_speculative_tokens=3, image_cuda_archs=["sm_120"], vllm_version="0.32.0",
        capture=CaptureSpec(**values),
    )  # fmt: skip
    path = tmp_path / "spec.json"
    path.write_text(spec.model_dump_json())
    return path


def post(port: int, path: str, body: dict[str, Any], **headers: str) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
        return response.read().decode()


def started(spec: Path, port: int) -> Any:
    process = run_workload("capture-proxy", spec, str(workloads_python()))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            get(port, "/health")
            return process
        except OSError:
            if process.poll() is not None:
                raise AssertionError(process.communicate()[1]) from None
            time.sleep(0.2)
    process.kill()
    raise AssertionError("capture-proxy did not start")


def records(tmp_path: Path) -> list[dict[str, Any]]:
    folder = tmp_path / "capture"
    return [json.loads(line) for f in sorted(folder.glob("*.jsonl")) for line in f.open()]


def test_requests_pass_unchanged_and_only_the_conversation_is_recorded(
    tmp_path: Path, engine: int
) -> None:
    port = free_port()
    folder = tmp_path / "capture"
    folder.mkdir()
    today = dt.datetime.now(dt.UTC).date()
    (folder / "2000-01-01.jsonl").write_text('{"old": 1}\n')  # beyond the retention
    (folder / f"{today - dt.timedelta(days=6)}.jsonl").write_text('{"kept": 1}\n')
    (folder / "notes.txt").write_text("the operator's own file")
    spec = serve_spec(tmp_path, engine, port, keep_request_fields=["metadata"],
                      max_prompts_per_day=2)  # fmt: skip
    process = started(spec, port)
    try:
        chat = {
            "model": "tiny", "stream": True, "stream_options": {"include_usage": True},
            "user": "alice@example.com", "metadata": {"team": "search"},
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "name": "alice", "content": [
                    {"type": "text", "text": "Describe "},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ]},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
            ],
        }  # fmt: skip
        status, streamed = post(port, "/v1/chat/completions", chat, Authorization="Bearer k")
        assert status == 200
        assert streamed.count(b"data: ") == 5 and b"three" in streamed  # every chunk, in order
        assert SEEN_HEADERS[-1]["Authorization"] == "Bearer k"  # the key reaches vLLM
        status, answer = post(port, "/v1/completions", {"model": "tiny", "prompt": "6 x 7 ="})
        assert status == 200 and json.loads(answer)["choices"][0]["text"] == "42"
        # the day's cap is 2: the third passes unrecorded
        assert post(port, "/v1/completions", {"model": "tiny", "prompt": "again"})[0] == 200
        metrics = get(port, "/metrics")
    finally:
        process.terminate()
        process.communicate(timeout=30)
    assert "vllm:num_requests_running 0" in metrics
    assert "kimideploy_capture_prompts 3" in metrics  # two today, one kept from six days ago
    assert "kimideploy_capture_over_cap_total 1" in metrics
    assert not (folder / "2000-01-01.jsonl").exists() and (folder / "notes.txt").exists()
    rows = [r for r in records(tmp_path) if r.get("day") == today.isoformat()]
    assert [r["endpoint"] for r in rows] == ["chat", "completions"]
    chat_row, completion_row = rows
    assert chat_row["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Describe <image>"},
        {"role": "assistant", "content": None},
    ]
    assert chat_row["fields"] == {"metadata": {"team": "search"}}
    assert chat_row["acceptance"] == ACCEPTANCE and chat_row["output_tokens"] == 3
    assert completion_row["prompt"] == "6 x 7 =" and completion_row["acceptance"] == ACCEPTANCE
    text = (folder / f"{today}.jsonl").read_text()
    for secret in ("alice", "Bearer", "base64", "c1", "127.0.0.1"):
        assert secret not in text, secret


def test_a_stream_without_usage_is_recorded_without_acceptance_and_a_dead_engine_is_a_502(
    tmp_path: Path, engine: int
) -> None:
    port = free_port()
    process = started(serve_spec(tmp_path, engine, port), port)
    try:
        body = {"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        assert post(port, "/v1/chat/completions", body)[0] == 200
        assert post(port, "/v1/chat/completions", body)[0] == 200
    finally:
        process.terminate()
        process.communicate(timeout=30)
    rows = records(tmp_path)
    assert len(rows) == 2 and rows[0]["key"] == rows[1]["key"]  # one prompt, counted twice
    assert rows[0]["acceptance"] is None
    dead, port = free_port(), free_port()
    spec = serve_spec(tmp_path, dead, port)
    process = run_workload("capture-proxy", spec, str(workloads_python()))
    try:
        status, text = 0, b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not status:
            try:
                status, text = post(port, "/v1/chat/completions", body)
            except OSError:
                time.sleep(0.2)
        assert status == 502 and b"vLLM is not answering" in text
    finally:
        process.terminate()
        process.communicate(timeout=30)


def test_retention_rolls_with_the_day(tmp_path: Path) -> None:
    days = iter([dt.date(2026, 12, 1), dt.date(2026, 12, 1), dt.date(2026, 12, 3)])
    store = CaptureStore(tmp_path, retention_days=2, max_per_day=5, clock=lambda: next(days))
    store.open()
    assert store.add({"key": "a"})
    assert (tmp_path / "2026-12-01.jsonl").exists()
    assert store.add({"key": "b"})  # two days later: the first day is past the retention
    assert not (tmp_path / "2026-12-01.jsonl").exists()
    assert (tmp_path / "2026-12-03.jsonl").read_text().count("\n") == 1
