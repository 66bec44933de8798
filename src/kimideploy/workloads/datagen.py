"""datagen: generate answers with the target model, kept as structure for its own chat template.

A sample is the prompt's messages and tools and the generated turn (reasoning, answer, tool
calls) as the endpoint returned them (chat_template.SAMPLE_FORMAT); extraction and training render
it with the target's template, as the serving engine does. Each shard takes every shards-th
prompt, asks an OpenAI-compatible endpoint (by default the non-speculative serve release) with
bounded concurrency, retries with backoff and a per-request timeout, and writes finished samples
in chunks with atomic renames. A restarted shard skips every
sample already in a chunk, so nothing is lost or duplicated; SIGTERM flushes and exits 75.
"""

from __future__ import annotations

import http.client
import json
import math
import random
import re
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from kimideploy.config.specs import DatagenSpec
from kimideploy.formats.bounded_io import CHUNK_LIMIT, UnreadableFileError, read_bytes
from kimideploy.formats.chat_template import SAMPLE_FORMAT
from kimideploy.formats.prompts import Prompt, PromptFileError, load_prompts
from kimideploy.workloads import dataset_record
from kimideploy.workloads.runtime import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    BadInputError,
    Progress,
    Stopper,
    atomic_write,
    emit,
    json_request_headers,
    log,
    remove_dead_temporaries,
    shard_index,
)
from kimideploy.workloads.writer_lock import WriterLock

RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class RequestFailedError(Exception):
    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


def completion(spec: DatagenSpec, prompt: Prompt) -> dict[str, Any]:
    """One streamed chat completion; reasoning and answer collected from the deltas. The first
    chunk may take `request_timeout_s` (queued behind other requests, then prefilled); after it,
    each chunk must follow the one before within `token_timeout_s`."""
    body: dict[str, Any] = {
        "model": spec.target.served_name,
        "messages": prompt.messages,
        "max_tokens": spec.max_tokens,
        "temperature": spec.temperature,
        "top_p": spec.top_p,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if prompt.tools:
        body["tools"] = prompt.tools
    reasoning: list[str] = []
    answer: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish: str | None = None
    usage: dict[str, Any] = {}
    try:
        for chunk in _stream(spec, body):
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                reasoning.append(delta.get("reasoning_content") or delta.get("reasoning") or "")
                answer.append(delta.get("content") or "")
                for part in delta.get("tool_calls") or []:
                    _add_tool_call_delta(calls, part)
                finish = choice.get("finish_reason") or finish
    except TimeoutError as exc:
        raise RequestFailedError(str(exc), True) from exc
    except (http.client.HTTPException, ConnectionError, OSError, ValueError) as exc:
        raise RequestFailedError(f"{type(exc).__name__}: {exc}", True) from exc
    return {
        "reasoning": "".join(reasoning),
        "answer": "".join(answer),
        "tool_calls": [calls[i] for i in sorted(calls)],
        "finish_reason": finish,
        "usage": usage,
    }


def _stream(spec: DatagenSpec, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The server-sent events of one streamed request, with the first-token and the between-token
    time limits on the socket."""
    url = urllib.parse.urlsplit(spec.endpoint.rstrip("/") + "/v1/chat/completions")
    connection_type = (
        http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    )
    connection = connection_type(url.netloc, timeout=spec.request_timeout_s)
    try:
        connection.request("POST", url.path, json.dumps(body).encode(), json_request_headers())
        # The response may take the socket over from the connection (a closing stream): keep it.
        sock = connection.sock
        try:
            response = connection.getresponse()
        except TimeoutError as exc:
            raise TimeoutError(f"no answer within {spec.request_timeout_s} s") from exc
        if response.status >= 400:
            raise RequestFailedError(f"HTTP {response.status}", response.status in RETRYABLE_STATUS)
        started = False
        while True:
            try:
                raw = response.readline()
            except TimeoutError as exc:
                limit = spec.token_timeout_s if started else spec.request_timeout_s
                what = "next chunk" if started else "first token"
                raise TimeoutError(f"no {what} within {limit} s") from exc
            if not raw:
                return
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            if not started:
                if sock is not None:
                    sock.settimeout(spec.token_timeout_s)
                started = True
            if line == "data: [DONE]":
                return
            yield json.loads(line[5:])
    finally:
        connection.close()


def _add_tool_call_delta(calls: dict[int, dict[str, Any]], part: dict[str, Any]) -> None:
    """Streamed tool calls arrive in pieces per index: the id and name once, arguments in parts."""
    call = calls.setdefault(
        int(part.get("index", len(calls))),
        {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
    )
    call["id"] = part.get("id") or call["id"]
    function = part.get("function") or {}
    call["function"]["name"] += function.get("name") or ""
    call["function"]["arguments"] += function.get("arguments") or ""


def generate(spec: DatagenSpec, prompt: Prompt, stopper: Stopper) -> dict[str, Any] | None:
    """With retries and exponential backoff; None when it keeps failing (counted, not fatal)."""
    for attempt in range(spec.max_retries + 1):
        try:
            result = completion(spec, prompt)
            break
        except RequestFailedError as exc:
            if not exc.retryable or attempt == spec.max_retries or stopper.stopping:
                log(f"prompt {prompt.index}: giving up after {attempt + 1} attempt(s): {exc}")
                return None
            time.sleep(min(60.0, 0.5 * 2**attempt) * (0.5 + random.random()))
    return {
        "format": SAMPLE_FORMAT,
        "id": prompt.id,
        "prompt_index": prompt.index,
        "messages": prompt.messages,
        "tools": prompt.tools,
        "reasoning": result["reasoning"],
        "answer": result["answer"],
        "tool_calls": result["tool_calls"],
        "finish_reason": result["finish_reason"],
        "usage": result["usage"],
    }


CHUNK_NAME = re.compile(r"^chunk-(\d{6,})\.jsonl$")


def finished_ids(shard_dir: Path) -> tuple[set[str], int]:
    """Sample ids in complete chunks, and the next chunk number: one past the highest there,
    so a removed chunk (what `data inspect` tells users to do with a damaged one) never makes a
    restart overwrite another."""
    ids: set[str] = set()
    highest = 0
    for chunk in sorted(shard_dir.glob("chunk-*.jsonl")):
        named = CHUNK_NAME.match(chunk.name)
        if named is None:
            continue
        highest = max(highest, int(named.group(1)))
        ids.update(chunk_ids(chunk))
    return ids, highest + 1


def chunk_ids(chunk: Path) -> list[str]:
    try:
        text = read_bytes(chunk, CHUNK_LIMIT).decode("utf-8")
    except (UnreadableFileError, UnicodeDecodeError) as exc:
        raise BadInputError(
            f"{chunk}: {exc}", hint="move the chunk aside; a restart generates its samples again"
        ) from exc
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line:
            continue
        try:
            found.append(str(json.loads(line)["id"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise BadInputError(
                f"{chunk}: line {number} is not a sample ({exc})",
                hint="move the chunk aside; a restart generates its samples again",
            ) from exc
    return found


def run(spec: DatagenSpec) -> int:
    index = shard_index()
    try:
        prompts = load_prompts(Path(spec.prompts))
    except (OSError, UnicodeDecodeError, PromptFileError) as exc:
        raise BadInputError(
            f"datagen.prompts: cannot read {spec.prompts} ({exc})",
            hint="copy the prompt file onto the datasets volume first",
        ) from exc
    if not prompts.prompts:
        raise BadInputError(f"{spec.prompts}: no usable prompts ({len(prompts.bad)} bad rows)")
    quota = math.ceil(min(spec.samples, len(prompts.prompts)) / spec.shards)
    mine = [p for i, p in enumerate(prompts.prompts) if i % spec.shards == index][:quota]
    # Before anything is written: a dataset is only ever extended by a run with its inputs.
    dataset_record.claim(
        Path(spec.output_dir), spec.fingerprint, {"prompts_sha256": prompts.sha256}
    )
    shard_dir = Path(spec.output_dir) / f"shard-{index:05d}"
    shard_dir.mkdir(parents=True, exist_ok=True)
    with WriterLock(shard_dir, f"shard {index} of {spec.output_dir}"):
        leftovers = remove_dead_temporaries(shard_dir)
        if leftovers:
            log(f"shard {index}: removed what a dead writer left half-written: {leftovers}")
        return _generate(spec, index, shard_dir, prompts, mine=mine)


def _generate(
    spec: DatagenSpec, index: int, shard_dir: Path, prompts: Any, *, mine: list[Prompt]
) -> int:
    done_ids, next_chunk = finished_ids(shard_dir)
    todo = [p for p in mine if p.id not in done_ids]
    log(f"shard {index}/{spec.shards}: {len(mine)} prompts, {len(mine) - len(todo)} already done")
    stopper, progress = (
        Stopper(),
        Progress("datagen", "samples", len(mine), already=len(mine) - len(todo)),
    )
    buffer: list[dict[str, Any]] = []
    failed = 0

    def flush() -> None:
        nonlocal next_chunk, buffer
        if buffer:
            data = "".join(json.dumps(r, sort_keys=True) + "\n" for r in buffer).encode()
            atomic_write(shard_dir / f"chunk-{next_chunk:06d}.jsonl", data)
            next_chunk, buffer = next_chunk + 1, []

    with ThreadPoolExecutor(max_workers=spec.concurrency) as pool:
        pending: set[Future[dict[str, Any] | None]] = set()
        queue = iter(todo)
        while True:
            while not stopper.stopping and len(pending) < spec.concurrency:
                prompt = next(queue, None)
                if prompt is None:
                    break
                pending.add(pool.submit(generate, spec, prompt, stopper))
            if not pending:
                break
            finished, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            for future in finished:
                record = future.result()
                if record is None:
                    failed += 1
                else:
                    buffer.append(record)
                progress.advance()
            if len(buffer) >= spec.chunk_samples:
                flush()
    flush()
    if stopper.stopping:
        log(f"shard {index}: stopped cleanly; a restart resumes from the chunks on disk")
        return EXIT_INTERRUPTED
    return _finish(spec, index, shard_dir, prompts, mine, failed)


def _finish(
    spec: DatagenSpec, index: int, shard_dir: Path, prompts: Any, mine: list[Prompt], failed: int
) -> int:
    ids, _ = finished_ids(shard_dir)
    records = [
        json.loads(line)
        for chunk in sorted(shard_dir.glob("chunk-*.jsonl"))
        if CHUNK_NAME.match(chunk.name)
        for line in read_bytes(chunk, CHUNK_LIMIT).decode("utf-8").splitlines()
        if line
    ]
    tokens = sum(int((r.get("usage") or {}).get("completion_tokens") or 0) for r in records)
    manifest = {
        "shard": index,
        "shards": spec.shards,
        "samples": len(ids),
        "assigned": len(mine),
        "failed_requests": failed,
        "bad_prompts": len(prompts.bad),
        "bad_prompt_examples": prompts.bad[:10],
        "completion_tokens": tokens,
        "endpoint": spec.endpoint,
        "model": {
            "repo": spec.target.repo,
            "revision": spec.target.revision,
            "served_name": spec.target.served_name,
        },
        "sampling": {
            "max_tokens": spec.max_tokens,
            "temperature": spec.temperature,
            "top_p": spec.top_p,
        },
        "prompts": {"path": spec.prompts, "sha256": prompts.sha256, "total": len(prompts.prompts)},
        "sample_format": SAMPLE_FORMAT,
    }
    atomic_write(
        shard_dir / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True).encode()
    )
    emit(
        {
            "event": "result",
            "stage": "datagen",
            "shard": index,
            "samples": len(ids),
            "failed_requests": failed,
            "bad_prompts": len(prompts.bad),
            "completion_tokens": tokens,
        }
    )
    if failed > spec.max_failed_share * len(mine):
        log(
            f"shard {index}: {failed} of {len(mine)} prompts failed after their retries "
            f"({failed / max(len(mine), 1):.1%}, above datagen.max_failed_share "
            f"{spec.max_failed_share:.1%}): the dataset would shrink silently. The samples made "
            "are kept; run again to retry the failed prompts (the run resumes)"
        )
        return EXIT_FAILED
    return EXIT_OK if len(ids) + failed >= len(mine) and len(ids) > 0 else EXIT_FAILED
