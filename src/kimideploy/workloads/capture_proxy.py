"""capture-proxy: the serve pod's sidecar that records served prompts for `drafter refresh`.

Only where `serve.capture` is set. It takes the pod's API port and passes every request to vLLM
on `engine_port` unchanged (any method and path: /v1, /health, /metrics, the keeper's routes),
streaming the answer back as it comes. A completed chat or completion request with status 200 is
then recorded, at most `max_prompts_per_day` per UTC day and each with probability
`sample_rate`, as one JSON line in `<directory>/<day>.jsonl`:

    {"day", "key", "endpoint", "messages" | "prompt", "max_tokens", "fields", "acceptance",
     "output_tokens"}

`messages` keeps each message's role and text (text parts of a multi-part content; an image is
kept as a marker, not its data), `tool_calls` only where the operator allows `tools`; `fields`
holds the top-level request fields the operator listed; `acceptance` is the response's own
`metrics.speculative_decoding` (vLLM >= 0.32 with --per-request-spec-decode-metrics), null where
it had none. Never recorded: headers (the API key, cookies, forwarding addresses), the client's
address, request ids, a message's `name`, the user fields (config/workloads.py refuses them).
`key` is the sha256 of the recorded conversation: the same prompt sent twice has one key, which
is how `drafter refresh` counts how much of the traffic a prompt stands for.

Retention: at start and at each new UTC day, the files of days older than `retention_days` are
deleted. /metrics answers vLLM's exposition with the capture's own series appended
(`kimideploy_capture_*`), which `status` reads through the same scrape.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kimideploy.config.specs import CaptureSpec, ServeSpec
from kimideploy.workloads.runtime import EXIT_OK, BadInputError, log

RECORDED_PATHS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
     "transfer-encoding", "upgrade", "host", "content-length"}
)  # fmt: skip
MAX_RECORDED_BODY = 8 * 1024 * 1024
"""A non-streamed answer larger than this is passed on but not parsed for its acceptance."""
STREAM_TAIL = 256 * 1024
"""The end of a streamed answer kept to find its final chunk's usage and acceptance."""
IMAGE_MARKER = "<image>"


def today() -> dt.date:
    return dt.datetime.now(dt.UTC).date()


@dataclass
class CaptureStore:
    """The day files of one release's capture folder: counts, the daily cap, retention."""

    directory: Path
    retention_days: int
    max_per_day: int
    clock: Callable[[], dt.date] = today
    counts: dict[str, int] = field(default_factory=dict)
    recorded: int = 0
    over_cap: int = 0
    day: dt.date | None = None

    def open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.roll()
        for path in sorted(self.directory.glob("*.jsonl")):
            with path.open("rb") as lines:
                self.counts[path.stem] = sum(1 for _ in lines)

    def roll(self) -> None:
        """A new day: delete the days older than the retention."""
        now = self.clock()
        if self.day == now:
            return
        self.day = now
        oldest = now - dt.timedelta(days=self.retention_days - 1)
        for path in self.directory.glob("*.jsonl"):
            try:
                day = dt.date.fromisoformat(path.stem)
            except ValueError:
                continue  # not a day file of ours: never deleted
            if day < oldest:
                path.unlink(missing_ok=True)
                self.counts.pop(path.stem, None)

    def add(self, row: dict[str, Any]) -> bool:
        self.roll()
        assert self.day is not None
        name = self.day.isoformat()
        if self.counts.get(name, 0) >= self.max_per_day:
            self.over_cap += 1
            return False
        line = json.dumps({"day": name, **row}, sort_keys=True, ensure_ascii=False)
        with (self.directory / f"{name}.jsonl").open("a", encoding="utf-8") as out:
            out.write(line + "\n")
        self.counts[name] = self.counts.get(name, 0) + 1
        self.recorded += 1
        return True

    def exposition(self) -> str:
        """The capture's series, appended to vLLM's /metrics."""
        files = sorted(self.directory.glob("*.jsonl"))
        size = sum(p.stat().st_size for p in files if p.exists())
        held = sum(self.counts.get(p.stem, 0) for p in files)
        oldest = files[0].stem if files else ""
        return (
            "# HELP kimideploy_capture_prompts Captured prompts the release's folder holds.\n"
            "# TYPE kimideploy_capture_prompts gauge\n"
            f"kimideploy_capture_prompts {held}\n"
            "# TYPE kimideploy_capture_days gauge\n"
            f"kimideploy_capture_days {len(files)}\n"
            "# TYPE kimideploy_capture_bytes gauge\n"
            f"kimideploy_capture_bytes {size}\n"
            "# TYPE kimideploy_capture_retention_days gauge\n"
            f"kimideploy_capture_retention_days {self.retention_days}\n"
            "# TYPE kimideploy_capture_over_cap_total counter\n"
            f"kimideploy_capture_over_cap_total {self.over_cap}\n"
            f'kimideploy_capture_info{{oldest_day="{oldest}"}} 1\n'
        )


def _message(message: Any, keep_tools: bool) -> dict[str, Any] | None:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        return None
    content = message.get("content")
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, dict):
                parts.append(IMAGE_MARKER)  # an image or audio part: its data is not kept
        content = "".join(parts)
    kept: dict[str, Any] = {"role": message["role"], "content": content}
    if keep_tools and message.get("tool_calls"):
        kept["tool_calls"] = message["tool_calls"]
    return kept


def recorded_request(endpoint: str, body: dict[str, Any], capture: CaptureSpec) -> dict[str, Any]:
    """What is kept of a request: the conversation, the answer length, the allowed fields."""
    keep_tools = "tools" in capture.keep_request_fields
    row: dict[str, Any] = {"endpoint": endpoint}
    if endpoint == "chat":
        messages = [_message(m, keep_tools) for m in body.get("messages") or []]
        row["messages"] = [m for m in messages if m is not None]
        keyed: Any = row["messages"]
    else:
        row["prompt"] = body.get("prompt") if isinstance(body.get("prompt"), str) else None
        keyed = row["prompt"]
    row["key"] = hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]
    row["max_tokens"] = body.get("max_completion_tokens") or body.get("max_tokens")
    row["fields"] = {name: body[name] for name in capture.keep_request_fields if name in body}
    return row


def answer_figures(raw: bytes, streamed: bool) -> tuple[dict[str, Any] | None, int | None]:
    """The response's own acceptance and output tokens (its last usage-carrying chunk)."""
    acceptance: dict[str, Any] | None = None
    tokens: int | None = None
    events: list[Any] = []
    if streamed:
        for line in raw.decode("utf-8", "replace").splitlines():
            line = line.strip()
            if line.startswith("data:") and line != "data: [DONE]":
                try:
                    events.append(json.loads(line[5:]))
                except ValueError:
                    continue  # the first line of the kept tail may be cut
    else:
        try:
            events.append(json.loads(raw))
        except ValueError:
            return None, None
    for event in events:
        if not isinstance(event, dict):
            continue
        found = (event.get("metrics") or {}).get("speculative_decoding")
        acceptance = found if isinstance(found, dict) else acceptance
        usage = event.get("usage") or {}
        tokens = usage.get("completion_tokens", tokens) if isinstance(usage, dict) else tokens
    return acceptance, tokens


class CaptureProxy:
    def __init__(self, capture: CaptureSpec, store: CaptureStore) -> None:
        self.capture = capture
        self.store = store
        self.upstream = f"http://127.0.0.1:{capture.engine_port}"
        self.random = random.Random()
        self.session: Any = None

    async def start(self, app: Any) -> None:
        import aiohttp

        # Answers stream for as long as they take: no total or read timeout here (the
        # client's own timeouts and vLLM's apply).
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None, sock_connect=10)
        self.session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)

    async def stop(self, app: Any) -> None:
        if self.session is not None:
            await self.session.close()

    async def handle(self, request: Any) -> Any:
        import aiohttp
        from aiohttp import web

        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            upstream = await self.session.request(
                request.method, self.upstream + request.path_qs, headers=headers, data=body,
                allow_redirects=False,
            )  # fmt: skip
        except aiohttp.ClientError as exc:
            return web.Response(status=502, text=f"capture-proxy: vLLM is not answering: {exc}\n")
        async with upstream:
            kept = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
            if request.path == "/metrics" and upstream.status == 200:
                text = (await upstream.read()).decode("utf-8", "replace")
                kept.pop("Content-Encoding", None)
                return web.Response(status=200, headers=kept, text=text + self.store.exposition())
            response = web.StreamResponse(status=upstream.status, headers=kept)
            await response.prepare(request)
            endpoint = RECORDED_PATHS.get(request.path)
            streamed = "text/event-stream" in upstream.headers.get("Content-Type", "")
            kept_bytes = bytearray()
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
                if endpoint is not None:
                    kept_bytes += chunk
                    if streamed and len(kept_bytes) > STREAM_TAIL:
                        del kept_bytes[: len(kept_bytes) - STREAM_TAIL]
                    elif not streamed and len(kept_bytes) > MAX_RECORDED_BODY:
                        endpoint = None  # too large to parse: passed on, not recorded
            await response.write_eof()
        if endpoint is not None and request.method == "POST" and upstream.status == 200:
            self.record(endpoint, body, bytes(kept_bytes), streamed)
        return response

    def record(self, endpoint: str, body: bytes, answer: bytes, streamed: bool) -> None:
        if self.random.random() >= self.capture.sample_rate:
            return
        try:
            request = json.loads(body)
        except ValueError:
            return
        if not isinstance(request, dict):
            return
        row = recorded_request(endpoint, request, self.capture)
        row["acceptance"], row["output_tokens"] = answer_figures(answer, streamed)
        try:
            self.store.add(row)
        except OSError as exc:  # a full volume loses a record, never a request
            log(f"capture-proxy: not recorded: {exc}")


def run(spec: ServeSpec) -> int:
    from aiohttp import web

    capture = spec.capture
    if capture is None:
        raise BadInputError("the serve spec has no capture: serve.capture is not set")
    store = CaptureStore(
        Path(capture.directory), capture.retention_days, capture.max_prompts_per_day
    )
    store.open()
    proxy = CaptureProxy(capture, store)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.on_startup.append(proxy.start)
    app.on_cleanup.append(proxy.stop)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    log(
        f"capture-proxy: :{capture.listen_port} -> vLLM :{capture.engine_port}; recording into "
        f"{capture.directory}, {capture.retention_days} days kept"
    )
    web.run_app(
        app, host="0.0.0.0", port=capture.listen_port, print=None, access_log=None,
        handle_signals=True, loop=asyncio.new_event_loop(),
    )  # fmt: skip
    return EXIT_OK
