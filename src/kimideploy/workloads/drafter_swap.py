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
- `DrafterKeeper`, the second `--middleware`: it keeps the served drafter the one the release's
  spec (the mounted spec ConfigMap) names. `kimideploy up` swaps by applying a spec that names
  another drafter and leaving the Deployment as it is; the ConfigMap reaches the pod's volume
  (kubelet, within about a minute), and the keeper swaps it in and answers what it serves on
  KEEPER_PATH, which kimideploy reads through the API server's pod proxy. A pod that restarts
  loads the drafter its Deployment names, and its keeper swaps in the wanted one as soon as the
  server answers. One keeper per container acts (a file lock), whatever the API-server count.
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
import contextlib
import fcntl
import hmac
import ipaddress
import json
import os
import secrets
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kimideploy.formats.drafter_swap import (
    DRAFTER_FILES_BACKEND,
    KEEPER_PATH,
    STARTED_WITH_ENV,
    SWAP_REFUSED,
    WANTED_SPEC_ENV,
    drafter_version,
)

ENGINE_MODULE = "kimideploy.workloads.drafter_swap_engine"
TOKEN_HEADER = "x-kimideploy-swap-token"
TOKEN_FILE_NAME = ".kimideploy-swap-token"
KEEPER_STATE_FILE_NAME = ".kimideploy-drafter-state.json"
KEEPER_LOCK_FILE_NAME = ".kimideploy-drafter-keeper.lock"
KEEPER_PERIOD_S = 1.0
KEEPER_RECHECK_S = 60.0
"""How often the keeper asks vLLM what it serves while the spec stays the same (the served drafter
changes only by a swap: the keeper's own, or one run by hand in the container)."""
KEEPER_RETRY_S = 15.0
"""After a swap that failed without a refusal (the engine busy, a volume not yet readable)."""
KEEPER_SWAPS_KEPT = 10
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


def _home() -> Path:
    return Path(os.environ.get("HOME") or "/tmp")


def token_path() -> Path:
    return _home() / TOKEN_FILE_NAME


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
        await _answer(send, 403, body)


async def _answer(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
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


def wanted_drafter(spec_path: Path) -> tuple[str | None, str]:
    """(folder, version) of the drafter the mounted spec names."""
    spec = json.loads(spec_path.read_text())
    drafter, folder = spec.get("drafter"), spec.get("drafter_path")
    if not drafter:
        raise ValueError(f"{spec_path} names no drafter")
    return folder, drafter_version(str(drafter))


def keeper_state_path() -> Path:
    return _home() / KEEPER_STATE_FILE_NAME


def read_keeper_state() -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads(keeper_state_path().read_text())
    except (OSError, ValueError):
        return {"state": "starting", "reason": "the keeper has not looked yet"}
    return state


@dataclass
class Keeper:
    """The loop behind DrafterKeeper: every KEEPER_PERIOD_S, compare what the spec wants with what
    vLLM serves (its weight_version; "default" until the first swap: the drafter it started
    with), swap when they differ, and write what it found where every API-server process of
    the container answers it from. A refused candidate is not tried again until the spec names
    another; a failed swap is tried again after KEEPER_RETRY_S."""

    url: str
    spec_path: Path
    started_with: str
    period_s: float = KEEPER_PERIOD_S

    def __post_init__(self) -> None:
        self.refused: dict[str, str] = {}
        self.retry_at: dict[str, float] = {}
        self.state: dict[str, Any] = {"state": "starting", "swaps": []}
        self.known: str | None = None
        self.known_at = 0.0

    def run_forever(self) -> None:
        with (_home() / KEEPER_LOCK_FILE_NAME).open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another API-server process of this pod keeps it
            while True:
                with contextlib.suppress(Exception):  # the loop must outlive any one look
                    self.step()
                time.sleep(self.period_s)

    def served(self, wanted: str) -> str:
        """What vLLM serves: asked when the spec wants something else than the last answer, and
        every KEEPER_RECHECK_S (not every second: each question is a line in vLLM's access log)."""
        now = time.monotonic()
        if self.known == wanted and now - self.known_at < KEEPER_RECHECK_S:
            return self.known
        info = _get(self.url, "/weight_info", pod_token(), 30)
        version = (info or {}).get("weight_version")
        self.known = self.started_with if version in (None, "", "default") else str(version)
        self.known_at = now
        return self.known

    def step(self) -> None:
        state = self.state
        try:
            folder, wanted = wanted_drafter(self.spec_path)
        except (OSError, ValueError) as exc:
            self._write(state="error", reason=f"{self.spec_path}: {exc}")
            return
        if wanted in self.refused:  # until the spec names another drafter
            self._write(state="refused", wanted=wanted, reason=self.refused[wanted])
            return
        try:
            serving = self.served(wanted)
        except SwapError as exc:
            self._write(state="waiting", wanted=wanted, reason=f"the server: {exc}")
            return
        state.update(wanted=wanted, serving=serving)
        if serving == wanted:
            self._write(state="serving", reason="")
        elif folder is None:
            self._write(state="refused", reason=f"{self.spec_path} names no drafter folder")
        elif time.monotonic() >= self.retry_at.get(wanted, 0.0):
            self._swap(folder, wanted)

    def _swap(self, folder: str, wanted: str) -> None:
        self._write(state="swapping", reason=f"loading {folder}")
        try:
            times = swap(folder, version=wanted, url=self.url)
        except SwapError as exc:
            reason = str(exc)
            if SWAP_REFUSED in reason:
                self.refused[wanted] = reason
                self._write(state="refused", reason=reason)
            else:
                self.retry_at[wanted] = time.monotonic() + KEEPER_RETRY_S
                self._write(state="failed", reason=reason)
            return
        self.known, self.known_at = times.weight_version or wanted, time.monotonic()
        record = {"to": wanted, "from": self.state.get("serving"), **asdict(times),
                  "at": time.time()}  # fmt: skip
        swaps = [*self.state.get("swaps", []), record][-KEEPER_SWAPS_KEPT:]
        self._write(state="serving", reason="", serving=times.weight_version or wanted,
                    swaps=swaps)  # fmt: skip

    def _write(self, **changes: Any) -> None:
        self.state.update(changes, pid=os.getpid(), started_with=self.started_with)
        path = keeper_state_path()
        draft = path.with_name(f"{path.name}.{os.getpid()}")
        draft.write_text(json.dumps(self.state, sort_keys=True))
        draft.replace(path)


class DrafterKeeper:
    """ASGI middleware: runs the Keeper in the API-server process once the server answers its
    first request (which also tells it the port), and answers KEEPER_PATH with its state."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.spec_path = os.environ.get(WANTED_SPEC_ENV)
        self.started_with = os.environ.get(STARTED_WITH_ENV)
        self.started = threading.Event()
        self.starting = threading.Lock()

    def start(self, scope: Scope) -> None:
        server = scope.get("server")
        if self.started.is_set() or not (self.spec_path and self.started_with and server):
            return
        with self.starting:
            if self.started.is_set():
                return
            keeper = Keeper(f"http://127.0.0.1:{server[1]}", Path(self.spec_path),
                            self.started_with)  # fmt: skip
            threading.Thread(target=keeper.run_forever, name="kimideploy-drafter-keeper",
                             daemon=True).start()  # fmt: skip
            self.started.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") == "http":
            self.start(scope)
            if _route_path(scope) == KEEPER_PATH and scope.get("method") in ("GET", "HEAD"):
                await _answer(send, 200, json.dumps(read_keeper_state()).encode())
                return
        await self.app(scope, receive, send)


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
