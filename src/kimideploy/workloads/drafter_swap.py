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
- The speculation switch (vLLM 0.32 with kimideploy's patch 0002): the keeper answers
  SPECULATION_PATH by calling the engine core's `set_speculation_enabled` through the API
  server's own engine client, and keeps speculation off while the spec says
  `"speculation": false` (`rollback serve --no-spec` on a server that can switch: seconds, not
  a ~25-minute reload). Switched off, the scheduler drafts nothing and no draft pass runs; the
  drafter stays loaded. Switched back on, the prefix cache is reset with its running requests,
  as after a swap: the drafter's KV cache was not written while it was off.
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
import re
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

from kimideploy.formats.bounded_io import UnreadableFileError, read_bytes
from kimideploy.formats.drafter_swap import (
    DRAFTER_FILES_BACKEND,
    DRAFTERS_ROOT_ENV,
    KEEPER_PATH,
    SPEC_SHA256_KEY,
    SPEC_SPECULATION_KEY,
    SPECULATION_PATH,
    STARTED_WITH_ENV,
    SWAP_REFUSED,
    WANTED_SPEC_ENV,
    drafter_version,
    folder_id,
    hold_drafter,
    sha256_mismatches,
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


TOKEN_BYTES = 32
"""The shortest token the guard accepts (hex characters): an empty or short file (planted, or
cut off) would otherwise authorise a request that offers the same nothing."""


class WeakTokenError(RuntimeError):
    """The container's token file holds fewer than TOKEN_BYTES characters."""


def pod_token() -> str:
    """The container's swap token: written once (0600), whichever API-server process comes first
    (O_EXCL|O_NOFOLLOW: a link planted at the draft's name is not written through; the hard link
    makes the file appear whole or not at all), read without following a link, and refused when
    shorter than TOKEN_BYTES."""
    path = token_path()
    if not os.path.lexists(path):
        draft = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(32))
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        finally:
            draft.unlink(missing_ok=True)
    try:
        token = read_bytes(path, 4096).decode(errors="replace").strip()
    except UnreadableFileError as exc:
        raise WeakTokenError(f"the swap token cannot be read: {exc}") from exc
    if len(token) < TOKEN_BYTES:
        raise WeakTokenError(
            f"{path} holds a token of {len(token)} characters, fewer than {TOKEN_BYTES}: the "
            "development routes stay closed; delete the file and restart the container"
        )
    return token


ENGINE_ROUTES = frozenset(
    {
        "/scale_elastic_ep",
        "/is_scaling_elastic_ep",
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
    }
)
"""vLLM routes outside its development mode that change the engine (elastic expert parallelism,
runtime LoRA loading when VLLM_ALLOW_RUNTIME_LORA_UPDATING is set): a shared cluster's other
tenants reach the serve port, so they are guarded as the development routes are."""


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


def from_the_pod(scope: Scope, token: str) -> bool:
    """Whether a request comes from the pod itself (a loopback address) with the pod's token."""
    if not _is_loopback(scope.get("client")):
        return False
    headers = dict(scope.get("headers") or [])
    offered = headers.get(TOKEN_HEADER.encode(), b"").decode(errors="replace")
    return len(token) >= TOKEN_BYTES and hmac.compare_digest(offered, token)


class DevRoutesGuard:
    """ASGI middleware: development routes only from the pod itself, with the pod's token."""

    def __init__(self, app: ASGIApp, guarded: frozenset[str] | None = None) -> None:
        self.app = app
        self.guarded = (dev_route_paths() | ENGINE_ROUTES) if guarded is None else guarded
        self.token = pod_token()  # WeakTokenError: the server does not start with an open door

    def allowed(self, scope: Scope) -> bool:
        return _route_path(scope) not in self.guarded or from_the_pod(scope, self.token)

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
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:2000]
        raise SwapError(f"{path}: HTTP {exc.code}: {detail}") from exc
    except OSError as exc:
        raise SwapError(f"{path}: {exc}") from exc


def swap(
    drafter: str, *, version: str, url: str = DEFAULT_URL, token: str | None = None,
    timeout: float = 600.0, sha256: dict[str, str] | None = None,
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
    update = {"path": drafter, **({"sha256": sha256} if sha256 else {})}
    _post(url, "/update_weights", {"update_info": update}, token, timeout)
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


SWITCH_UTILITY = "set_speculation_enabled"
"""The engine core's utility patch 0002 adds (None: report only)."""
NO_SWITCH = "this server's vLLM has no speculation switch (kimideploy's patch 0002)"


@dataclass(frozen=True)
class SwitchTimes:
    """One switch as the client saw it: where speculation is now, and the seconds it took."""

    speculation: bool
    changed: bool
    reset: bool | None
    seconds: float


def switch_speculation(
    enabled: bool | None,
    *,
    url: str = DEFAULT_URL,
    token: str | None = None,
    timeout: float = 120.0,
) -> SwitchTimes:
    """Switch speculation in the running server off (False), on (True) or only ask (None)."""
    token = pod_token() if token is None else token
    began = time.monotonic()
    if enabled is None:
        answer = _get(url, SPECULATION_PATH, token, timeout)
    else:
        query = "true" if enabled else "false"
        answer = _post(url, f"{SPECULATION_PATH}?enabled={query}", {}, token, timeout)
    return SwitchTimes(
        speculation=bool((answer or {}).get("speculation")),
        changed=bool((answer or {}).get("changed")),
        reset=(answer or {}).get("reset"),
        seconds=round(time.monotonic() - began, 3),
    )


async def _engine_switch(scope: Scope, enabled: bool | None) -> dict[str, Any]:
    """Ask every engine core of this API server's client (None: only report). Switching on
    resets the prefix cache with its running requests: the drafter's KV cache was not written
    while speculation was off, and a cached block or a running request would feed it stale."""
    client = scope["app"].state.engine_client
    core = client.engine_core
    was = all(await core.call_utility_all_async(SWITCH_UTILITY, None))
    if enabled is None or enabled == was:
        return {"speculation": was, "changed": False, "reset": None}
    now = all(await core.call_utility_all_async(SWITCH_UTILITY, enabled))
    reset = bool(await client.reset_prefix_cache(True)) if now else None
    return {"speculation": now, "changed": now != was, "reset": reset}


def _wanted_switch(scope: Scope) -> tuple[bool | None, str]:
    """(enabled, "") from a request's `?enabled=`, or (None, why) when it names no state."""
    if scope.get("method") in ("GET", "HEAD"):
        return None, ""
    query = dict(
        part.split("=", 1)
        for part in (scope.get("query_string") or b"").decode().split("&")
        if "=" in part
    )
    value = query.get("enabled", "").lower()
    if value in ("true", "1", "on"):
        return True, ""
    if value in ("false", "0", "off"):
        return False, ""
    return None, f"POST {SPECULATION_PATH}?enabled=true|false (got {value!r})"


@dataclass(frozen=True)
class Wanted:
    """What the mounted spec asks the keeper to serve."""

    folder: str | None
    version: str
    speculation: bool
    """False: the revision serves without speculation; the drafter stays loaded."""
    sha256: dict[str, str]
    """The files' sha256s the release recorded (empty: none known)."""

    @property
    def key(self) -> str:
        """What a refusal is remembered by: the same name at another folder is another ask."""
        return f"{self.version}@{self.folder}"


SPEC_LIMIT = 1024 * 1024
"""A serve spec is a few kB. It is a ConfigMap volume (its file is a link the kubelet swaps), so
it is read through the link, bounded."""


def wanted_drafter(spec_path: Path) -> Wanted:
    """The drafter (folder, version, sha256s) and the speculation state the mounted spec names."""
    with spec_path.open("rb") as handle:
        raw = handle.read(SPEC_LIMIT + 1)
    if len(raw) > SPEC_LIMIT:
        raise ValueError(f"{spec_path}: over {SPEC_LIMIT:,} bytes")
    spec = json.loads(raw)
    if not isinstance(spec, dict):
        raise ValueError(f"{spec_path}: not a JSON object")
    drafter, folder = spec.get("drafter"), spec.get("drafter_path")
    if not drafter:
        raise ValueError(f"{spec_path} names no drafter")
    speculation = spec.get(SPEC_SPECULATION_KEY, True)
    if not isinstance(speculation, bool):
        raise ValueError(f"{spec_path}: {SPEC_SPECULATION_KEY} must be true or false")
    sha256 = spec.get(SPEC_SHA256_KEY) or {}
    if not isinstance(sha256, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in sha256.items()
    ):
        raise ValueError(f"{spec_path}: {SPEC_SHA256_KEY} must map file names to sha256s")
    return Wanted(folder, drafter_version(str(drafter)), speculation, sha256)


def folder_refusal(folder: str, root: str | None) -> str | None:
    """Why the keeper will not ask the engine to load `folder` (None: it may): only a folder
    under the models mount, named without `..` or a doubled slash, and reached through no link.
    A spec the release did not write (anyone who can update ConfigMaps in the namespace) can
    then only name a drafter that is already on the models volume, never /tmp or a path of its
    own."""
    if not root:
        return f"{DRAFTERS_ROOT_ENV} is not set: this container names no models mount to swap from"
    path = Path(folder)
    if not path.is_absolute() or os.path.normpath(folder) != folder or "//" in folder:
        return f"{folder}: not a plain absolute path"
    if not folder.startswith(root.rstrip("/") + "/"):
        return f"{folder}: not under the models mount {root}"
    if os.path.realpath(folder) != folder:
        return f"{folder}: reached through a symbolic link ({os.path.realpath(folder)})"
    return None


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
    with; and whether speculation is on), switch and swap until they agree, and write what it
    found where every API-server process of the container answers it from. A refused candidate
    is not tried again until the spec names another; a failed swap or switch is tried again
    after KEEPER_RETRY_S."""

    url: str
    spec_path: Path
    started_with: str
    period_s: float = KEEPER_PERIOD_S

    def __post_init__(self) -> None:
        self.refused: dict[str, str] = {}
        self.retry_at: dict[str, float] = {}
        self.state: dict[str, Any] = {"state": "starting", "swaps": [], "switches": []}
        self.known: str | None = None
        self.known_at = 0.0
        self.speculating: bool | None = None
        self.speculating_at = 0.0

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

    def speculation_now(self, wanted: bool) -> bool | None:
        """Whether speculation is on (None: this vLLM has no switch), asked as `served` is: a
        container that restarted comes back with it on, whatever the keeper last set."""
        now = time.monotonic()
        if self.speculating == wanted and now - self.speculating_at < KEEPER_RECHECK_S:
            return self.speculating
        try:
            self.speculating = switch_speculation(None, url=self.url).speculation
        except SwapError as exc:
            if NO_SWITCH not in str(exc):
                raise
            self.speculating = None
        self.speculating_at = now
        return self.speculating

    def step(self) -> None:
        try:
            wanted = wanted_drafter(self.spec_path)
        except (OSError, ValueError) as exc:
            self._write(state="error", reason=f"{self.spec_path}: {exc}")
            return
        try:
            speculating = self.speculation_now(wanted.speculation)
        except SwapError as exc:
            self._write(state="waiting", wanted=wanted.version, reason=f"the server: {exc}")
            return
        if speculating is None and not wanted.speculation:
            reason = f"the spec asks for speculation off: {NO_SWITCH}"
            self._write(state="refused", wanted=wanted.version, speculation="on", reason=reason)
            return
        switching = speculating is not None and speculating != wanted.speculation
        if switching and not self._switch(wanted.speculation, wanted.version):
            return
        if not wanted.speculation:
            self._write(state="off", wanted=wanted.version, speculation="off", reason="")
            return
        self._keep_drafter(wanted)

    def _keep_drafter(self, wanted: Wanted) -> None:
        state = self.state
        if wanted.key in self.refused:  # until the spec names another drafter or folder
            reason = self.refused[wanted.key]
            self._write(state="refused", wanted=wanted.version, reason=reason)
            return
        try:
            serving = self.served(wanted.version)
        except SwapError as exc:
            self._write(state="waiting", wanted=wanted.version, reason=f"the server: {exc}")
            return
        state.update(wanted=wanted.version, serving=serving, speculation="on")
        if serving == wanted.version:
            self._write(state="serving", reason="")
        elif wanted.folder is None:
            self._write(state="refused", reason=f"{self.spec_path} names no drafter folder")
        elif time.monotonic() >= self.retry_at.get(wanted.version, 0.0):
            self._swap(wanted, wanted.folder)

    def _switch(self, enabled: bool, wanted: str) -> bool:
        """Switch speculation; True when it is where the spec wants it afterwards."""
        key = f"speculation:{enabled}"
        if time.monotonic() < self.retry_at.get(key, 0.0):
            return False
        word = "on" if enabled else "off"
        self._write(state="switching", wanted=wanted, reason=f"speculation {word}")
        try:
            times = switch_speculation(enabled, url=self.url)
        except SwapError as exc:
            self.retry_at[key] = time.monotonic() + KEEPER_RETRY_S
            self._write(state="failed", reason=f"switching speculation {word}: {exc}")
            return False
        self.speculating, self.speculating_at = times.speculation, time.monotonic()
        if times.speculation != enabled or (enabled and times.reset is False):
            self.retry_at[key] = time.monotonic() + KEEPER_RETRY_S
            answered = f"speculation {times.speculation}, prefix cache reset {times.reset}"
            self._write(
                state="failed", reason=f"speculation {word}: the engine answered {answered}"
            )
            return False
        record = {"to": word, "seconds": times.seconds, "reset": times.reset, "at": time.time()}
        switches = [*self.state.get("switches", []), record][-KEEPER_SWAPS_KEPT:]
        self._write(speculation=word, switches=switches)
        return True

    def _refusal(self, wanted: Wanted, folder: str) -> str | None:
        """The keeper's own checks before the engine is asked: the folder, then the files
        against the release's sha256s (the engine checks its own read of them again)."""
        refusal = folder_refusal(folder, os.environ.get(DRAFTERS_ROOT_ENV))
        if refusal is None and wanted.sha256:
            held = hold_drafter(Path(folder))
            problems = held.problems or sha256_mismatches(held, wanted.sha256)
            refusal = "; ".join(problems) if problems else None
        return None if refusal is None else f"{folder} {SWAP_REFUSED}: {refusal}"

    def _swap(self, wanted: Wanted, folder: str) -> None:
        refusal = self._refusal(wanted, folder)
        if refusal is not None:
            self.refused[wanted.key] = refusal
            self._write(state="refused", reason=refusal)
            return
        self._write(state="swapping", reason=f"loading {folder}")
        try:
            times = swap(folder, version=wanted.version, url=self.url, sha256=wanted.sha256)
        except SwapError as exc:
            reason = str(exc)
            if SWAP_REFUSED in reason:
                self.refused[wanted.key] = reason
                self._write(state="refused", reason=reason)
            else:
                self.retry_at[wanted.version] = time.monotonic() + KEEPER_RETRY_S
                self._write(state="failed", reason=reason)
            return
        self.known, self.known_at = times.weight_version or wanted.version, time.monotonic()
        record = {"to": wanted.version, "from": self.state.get("serving"), **asdict(times),
                  "at": time.time()}  # fmt: skip
        swaps = [*self.state.get("swaps", []), record][-KEEPER_SWAPS_KEPT:]
        self._write(state="serving", reason="", serving=times.weight_version or wanted.version,
                    folder=folder, verified=bool(wanted.sha256), swaps=swaps)  # fmt: skip

    def _write(self, **changes: Any) -> None:
        reason = changes.get("reason")
        if reason and reason != self.state.get("reason"):
            # The whole reason is for the container's log (`kimideploy logs serve`); the answer
            # to clients outside the pod carries only public_reason's part of it.
            print(f"kimideploy drafter keeper: {changes.get('state', self.state.get('state'))}: "
                  f"{reason}", file=sys.stderr, flush=True)  # fmt: skip
        self.state.update(changes, pid=os.getpid(), started_with=self.started_with)
        path = keeper_state_path()
        draft = path.with_name(f"{path.name}.{os.getpid()}")
        draft.write_text(json.dumps(self.state, sort_keys=True))
        draft.replace(path)


PUBLIC_STATE_KEYS = ("state", "wanted", "serving", "speculation", "swaps", "switches", "verified",
                     "started_with")  # fmt: skip
_ABSOLUTE_PATH = re.compile(r"(?<![\w.])/[^\s:;,()'\"]+")


def public_reason(state: str, reason: str) -> str:
    """The keeper's reason as a client outside the pod may read it (the Service's clients and
    the API server's pod proxy, kimideploy's own `up` and `status` included): a refusal by the
    swap rule keeps its reasons with each folder named by its last part; a server error or an
    unreadable spec is only named, its text is in the container's log."""
    if not reason:
        return ""
    if state in ("failed", "waiting", "error"):
        return f"{state}: the server's answer is in the serve container's log"
    return _ABSOLUTE_PATH.sub(lambda m: Path(m.group(0)).name, reason)


def public_state(state: dict[str, Any]) -> dict[str, Any]:
    out = {k: state[k] for k in PUBLIC_STATE_KEYS if k in state}
    out["reason"] = public_reason(str(state.get("state") or ""), str(state.get("reason") or ""))
    if state.get("folder"):
        out["folder_id"] = folder_id(str(state["folder"]), os.environ.get(DRAFTERS_ROOT_ENV, ""))
    return out


class DrafterKeeper:
    """ASGI middleware: runs the Keeper in the API-server process once the server answers its
    first request (which also tells it the port), and answers KEEPER_PATH with its state."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.spec_path = os.environ.get(WANTED_SPEC_ENV)
        self.started_with = os.environ.get(STARTED_WITH_ENV)
        self.started = threading.Event()
        self.starting = threading.Lock()

    @staticmethod
    def token() -> str:
        try:
            return pod_token()
        except WeakTokenError:
            return ""  # nobody is from the pod: every answer is the public one

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
            path = _route_path(scope)
            if path == KEEPER_PATH and scope.get("method") in ("GET", "HEAD"):
                state = read_keeper_state()
                if not from_the_pod(scope, self.token()):
                    state = public_state(state)
                await _answer(send, 200, json.dumps(state).encode())
                return
            if path == SPECULATION_PATH:
                await self.answer_switch(scope, send)
                return
        await self.app(scope, receive, send)

    async def answer_switch(self, scope: Scope, send: Send) -> None:
        """SPECULATION_PATH: only from the pod itself with its token (this middleware is
        outside the guard: vLLM adds --middleware in order, and the last one sees requests
        first)."""
        if not from_the_pod(scope, pod_token()):
            body = {"error": f"{SPECULATION_PATH} answers only inside the serving container"}
            await _answer(send, 403, json.dumps(body).encode())
            return
        enabled, problem = _wanted_switch(scope)
        if problem:
            await _answer(send, 400, json.dumps({"error": problem}).encode())
            return
        try:
            answer = await _engine_switch(scope, enabled)
        except Exception as exc:  # the engine's own error, or a vLLM without the utility
            missing = SWITCH_UTILITY in str(exc) or isinstance(exc, AttributeError)
            body = {"error": NO_SWITCH if missing else f"the engine: {exc}"}
            await _answer(send, 501 if missing else 500, json.dumps(body).encode())
            return
        await _answer(send, 200, json.dumps(answer).encode())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kimideploy.workloads.drafter_swap")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--drafter", help="swap in this drafter folder, as the pod mounts it")
    which.add_argument(
        "--speculation",
        choices=("on", "off", "show"),
        help="switch speculation in the running server, or show it",
    )
    parser.add_argument("--version", help="the label /weight_info answers after a swap")
    parser.add_argument("--url", default=DEFAULT_URL)
    args = parser.parse_args(argv)
    if args.speculation is not None:
        enabled = {"on": True, "off": False, "show": None}[args.speculation]
        try:
            switched = switch_speculation(enabled, url=args.url)
        except (SwapError, OSError) as exc:
            print(json.dumps({"event": "switch", "ok": False, "error": str(exc)}), flush=True)
            return 1
        print(json.dumps({"event": "switch", "ok": True, **asdict(switched)}), flush=True)
        return 0
    if not args.version:
        parser.error("--drafter needs --version")
    try:
        times = swap(args.drafter, version=args.version, url=args.url)
    except (SwapError, OSError) as exc:
        print(json.dumps({"event": "swap", "ok": False, "error": str(exc)}), flush=True)
        return 1
    print(json.dumps({"event": "swap", "ok": True, **asdict(times)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
