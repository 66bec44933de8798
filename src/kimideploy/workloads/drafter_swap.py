"""Replace the drafter of a running vLLM without reloading the target, and keep that door shut.

Three parts, all in the serve image:

- `register`, a vLLM general plugin (the `vllm.general_plugins` entry point in pyproject.toml):
  vLLM loads it in every process, and it registers kimideploy's weight-transfer backend
  (DRAFTER_FILES_BACKEND, workloads/drafter_swap_engine.py). vLLM 0.32's own backends move
  weights from a trainer over NCCL or CUDA IPC; a swap reads a drafter that is already on the
  models volume every replica mounts, so the backend reads files.
- `DevRoutesGuard`, the ASGI middleware the serve args add (`--middleware`): vLLM registers the
  weight-update routes only in its development mode (VLLM_SERVER_DEV_MODE=1), together with
  routes that reset caches, put the engine to sleep or call any worker method (`/collective_rpc`).
  The serve Service and port reach every route of the port, so the guard answers 403 to each of
  those routes unless the request comes from the pod itself (a loopback address) and carries the
  token this middleware wrote into the container's HOME at start-up. kimideploy swaps through
  `kubectl exec` into the serving container (this module's `main`), which reads the token there;
  a request through the Service, another pod, or a mesh proxy that forwards to loopback has no
  token. Which routes are guarded is read from the pinned vLLM's own dev routers, not listed here.
- `swap`, the client: start a draft weight update, load the new files, finish it (one collective
  RPC each, each run by the engine between two scheduler steps), then reset the prefix cache.
  No pause: the target verifies every draft, so a step drafted with half-updated weights can
  only be accepted less, never change what is served. The reset is not optional: the KV cache
  holds the drafter's keys and values too, computed by the weights that were there, and a cached
  prefix (a system prompt every request shares) would keep feeding them to the new drafter for
  as long as it stays cached (measured on the tier: an untrained drafter swapped in after the good
  one was benched on the same prompts counted 1.39 instead of 1.00). Running requests are put
  back in the queue and prefilled again (`reset_running_requests`): their outputs do not change,
  their next token comes one prefill later.
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import json
import os
import secrets
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kimideploy.formats.drafter_swap import DRAFTER_FILES_BACKEND

ENGINE_MODULE = "kimideploy.workloads.drafter_swap_engine"
TOKEN_HEADER = "x-kimideploy-swap-token"
TOKEN_FILE_NAME = ".kimideploy-swap-token"
DEFAULT_URL = "http://127.0.0.1:8000"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def register() -> None:
    """vLLM's general-plugin hook: make the files backend known to the weight-transfer factory."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if DRAFTER_FILES_BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(
            DRAFTER_FILES_BACKEND, ENGINE_MODULE, "DrafterFilesEngine"
        )


def token_path() -> Path:
    return Path(os.environ.get("HOME") or "/tmp") / TOKEN_FILE_NAME


def pod_token() -> str:
    """The container's swap token: written once (0600), whichever API-server process comes first;
    a link makes the file appear whole or not at all."""
    path = token_path()
    if not path.exists():
        draft = path.with_name(f"{path.name}.{os.getpid()}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(32))
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        finally:
            draft.unlink(missing_ok=True)
    return path.read_text().strip()


def dev_route_paths() -> frozenset[str]:
    """Every path the pinned vLLM adds in development mode (its dev and RL routers)."""
    from fastapi import FastAPI
    from vllm.entrypoints.rl.factories import register_rl_api_routers
    from vllm.entrypoints.serve import register_vllm_dev_api_routers

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    register_vllm_dev_api_routers(app)
    register_rl_api_routers(app)
    return frozenset(str(getattr(route, "path", "")) for route in app.routes) - {""}


def _is_loopback(client: Any) -> bool:
    if not client:
        return False
    try:
        return ipaddress.ip_address(str(client[0])).is_loopback
    except ValueError:
        return False


def _route_path(scope: Scope) -> str:
    """The path as the router matches it: without the app's root path (`--root-path`), without
    a trailing or doubled slash (Starlette redirects those to the route)."""
    path, root = str(scope.get("path") or ""), str(scope.get("root_path") or "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return "/" + "/".join(part for part in path.split("/") if part)


class DevRoutesGuard:
    """ASGI middleware: development routes only from the pod itself, with the pod's token."""

    def __init__(self, app: ASGIApp, guarded: frozenset[str] | None = None) -> None:
        self.app = app
        self.guarded = dev_route_paths() if guarded is None else guarded
        self.token = pod_token()

    def allowed(self, scope: Scope) -> bool:
        if _route_path(scope) not in self.guarded:
            return True
        if not _is_loopback(scope.get("client")):
            return False
        headers = dict(scope.get("headers") or [])
        offered = headers.get(TOKEN_HEADER.encode(), b"").decode(errors="replace")
        return hmac.compare_digest(offered, self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or self.allowed(scope):
            await self.app(scope, receive, send)
            return
        body = json.dumps(
            {
                "error": f"{scope.get('path')} is a development route: kimideploy answers it only "
                "from inside the serving container (kubectl exec), with the pod's swap token"
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 403,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})


STALE_SESSION = "already active"
"""What vLLM's worker says when a weight update is started while another is open."""


class SwapError(RuntimeError):
    """The server refused or failed a step; the message is its answer."""


@dataclass(frozen=True)
class SwapTimes:
    """Seconds per step of one swap, as the client saw them."""

    start_s: float
    load_s: float
    finish_s: float
    reset_s: float
    total_s: float
    weight_version: str | None


def _post(url: str, path: str, body: dict[str, Any], token: str, timeout: float) -> Any:
    request = urllib.request.Request(
        url.rstrip("/") + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", TOKEN_HEADER: token},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:2000]
        raise SwapError(f"{path}: HTTP {exc.code}: {detail}") from exc
    except OSError as exc:
        raise SwapError(f"{path}: {exc}") from exc


def _get(url: str, path: str, token: str, timeout: float) -> Any:
    request = urllib.request.Request(url.rstrip("/") + path, headers={TOKEN_HEADER: token})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read() or b"null")
    except (urllib.error.HTTPError, OSError) as exc:
        raise SwapError(f"{path}: {exc}") from exc


def swap(
    drafter: str, *, version: str, url: str = DEFAULT_URL, token: str | None = None,
    timeout: float = 600.0,
) -> SwapTimes:  # fmt: skip
    """Load `drafter` (a folder every replica can read) into the running server's draft model.

    A failed load leaves the running drafter serving (the engine checks before it writes and puts
    the old values back if a write fails) and closes the update, so the next swap can start."""
    token = pod_token() if token is None else token
    began = time.monotonic()
    try:
        _post(url, "/start_draft_weight_update", {}, token, timeout)
    except SwapError as exc:
        if STALE_SESSION not in str(exc):
            raise
        # A swap that stopped between its start and its load (the client killed, the exec cut)
        # left the session open, and vLLM refuses every later start until it is finished.
        _post(url, "/finish_weight_update", {}, token, timeout)
        _post(url, "/start_draft_weight_update", {}, token, timeout)
    started = time.monotonic()
    # A load that raises closes the worker's session itself: nothing is left to finish.
    _post(url, "/update_weights", {"update_info": {"path": drafter}}, token, timeout)
    loaded = time.monotonic()
    _post(url, "/finish_weight_update", {"weight_version": version}, token, timeout)
    finished = time.monotonic()
    reset = _post(url, "/reset_prefix_cache?reset_running_requests=true", {}, token, timeout)
    if not (reset or {}).get("success"):
        raise SwapError(f"/reset_prefix_cache: the engine did not reset its cache ({reset})")
    cleared = time.monotonic()
    info = _get(url, "/weight_info", token, timeout)
    return SwapTimes(
        start_s=round(started - began, 3),
        load_s=round(loaded - started, 3),
        finish_s=round(finished - loaded, 3),
        reset_s=round(cleared - finished, 3),
        total_s=round(cleared - began, 3),
        weight_version=(info or {}).get("weight_version"),
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kimideploy.workloads.drafter_swap")
    parser.add_argument("--drafter", required=True, help="the drafter folder, as the pod mounts it")
    parser.add_argument("--version", required=True, help="the label /weight_info answers after it")
    parser.add_argument("--url", default=DEFAULT_URL)
    args = parser.parse_args(argv)
    try:
        times = swap(args.drafter, version=args.version, url=args.url)
    except (SwapError, OSError) as exc:
        print(json.dumps({"event": "swap", "ok": False, "error": str(exc)}), flush=True)
        return 1
    print(json.dumps({"event": "swap", "ok": True, **asdict(times)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
