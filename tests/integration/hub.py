"""A local server speaking the two Hugging Face hub endpoints `hub_sync.py` uses.

GET /api/models/{repo}/revision/{rev}?blobs=true and GET /{repo}/resolve/{rev}/{file} with Range
(`bytes=a-b` and `bytes=a-`, answered 206 with Content-Range, as the hub's CDN does) and
Bearer-token checks. `drop_once` cuts the first download of a file halfway through, so resuming
can be tested; `requests` records what was asked, including Range headers, and `served` the byte
ranges actually sent. `per_connection_bytes_per_s` limits each connection's bandwidth (as hubs
and mirrors do per stream), `ignore_ranges` answers every request with the whole file, and
`extra_bytes` appends bytes the listing does not count (a misbehaving mirror).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Hub:
    def __init__(
        self, repo: str, revision: str, files: dict[str, bytes], token: str, lfs: set[str]
    ) -> None:
        self.repo, self.revision, self.files, self.token, self.lfs = (
            repo,
            revision,
            files,
            token,
            lfs,
        )
        self.drop_once: set[str] = set()
        self.corrupt: set[str] = set()
        self.requests: list[tuple[str, str | None, str | None]] = []
        self.served: list[tuple[str, int, int]] = []  # (file, start, end exclusive) sent
        self.per_connection_bytes_per_s: float | None = None
        self.ignore_ranges = False
        self.extra_bytes = b""
        self.ranges_from_zero = False  # a mirror that answers every range from byte 0
        self.listing: list[dict[str, Any]] | None = None  # a hostile listing, served as is
        self.others: dict[str, tuple[str, dict[str, bytes]]] = {}
        """More repositories (repo -> (revision, files)), for a host that syncs drafters too."""
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                hub.handle(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add_repo(self, repo: str, revision: str, files: dict[str, bytes]) -> None:
        self.others[repo] = (revision, files)

    def siblings(self, files: dict[str, bytes] | None = None) -> list[dict[str, Any]]:
        if self.listing is not None and files is None:
            return self.listing
        found = []
        for name, data in (self.files if files is None else files).items():
            entry: dict[str, Any] = {
                "rfilename": name,
                "size": len(data),
                "blobId": hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest(),
            }
            if name in self.lfs:
                entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
            found.append(entry)
        return found

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        auth = request.headers.get("Authorization")
        self.requests.append((request.path, request.headers.get("Range"), auth))
        if auth != f"Bearer {self.token}":
            request.send_error(401)
            return
        for repo, (revision, files) in self.others.items():
            if self._serve_other(request, repo, revision, files):
                return
        api = f"/api/models/{self.repo}/revision/"
        prefix = f"/{self.repo}/resolve/{self.revision}/"
        if request.path.startswith(api):
            if not request.path.startswith(api + self.revision):
                request.send_error(404)
                return
            body = json.dumps({"sha": self.revision, "siblings": self.siblings()}).encode()
            request.send_response(200)
            request.send_header("Content-Length", str(len(body)))
            request.end_headers()
            request.wfile.write(body)
        elif request.path.startswith(prefix) and request.path[len(prefix) :] in self.files:
            self.send_file(request, request.path[len(prefix) :])
        else:
            request.send_error(404)

    def _serve_other(self, request: BaseHTTPRequestHandler, repo: str, revision: str,
                     files: dict[str, bytes]) -> bool:  # fmt: skip
        """Answer for an added repository, plainly (no drops, throttling or corruption)."""
        if request.path.startswith(f"/api/models/{repo}/revision/{revision}"):
            body = json.dumps({"sha": revision, "siblings": self.siblings(files)}).encode()
        elif request.path.startswith(f"/{repo}/resolve/{revision}/"):
            name = request.path.split(f"/resolve/{revision}/", 1)[1]
            if name not in files:
                request.send_error(404)
                return True
            body = files[name]
        else:
            return False
        request.send_response(200)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)
        return True

    def send_file(self, request: BaseHTTPRequestHandler, name: str) -> None:
        data = self.files[name] + self.extra_bytes
        if name in self.corrupt:
            data = data[:-1] + bytes([data[-1] ^ 1])
        start, end = 0, len(data)
        ranged = request.headers.get("Range") if not self.ignore_ranges else None
        if ranged:
            first, _, last = ranged.removeprefix("bytes=").partition("-")
            start, end = int(first), (int(last) + 1 if last else len(data))
            if self.ranges_from_zero:
                start, end = 0, end - start
        body = data[start:end]
        request.send_response(206 if ranged else 200)
        request.send_header("Content-Length", str(len(body)))
        if ranged:
            request.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        request.end_headers()
        if name in self.drop_once:
            self.drop_once.discard(name)
            request.wfile.write(body[: len(body) // 2])
            self.served.append((name, start, start + len(body) // 2))
            request.wfile.flush()
            request.close_connection = True
            request.connection.shutdown(2)
            return
        self._write_throttled(request, name, body, start)

    def _write_throttled(
        self, request: BaseHTTPRequestHandler, name: str, body: bytes, start: int
    ) -> None:
        rate = self.per_connection_bytes_per_s
        step = 64 * 1024 if rate else len(body) or 1
        began, sent = time.monotonic(), 0
        try:
            while sent < len(body):
                request.wfile.write(body[sent : sent + step])
                sent += min(step, len(body) - sent)
                if rate:
                    ahead = sent / rate - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)
        except OSError:  # the client went away (a kill, or it read what it asked for)
            pass
        self.served.append((name, start, start + sent))

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
