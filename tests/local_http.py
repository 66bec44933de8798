"""A quiet HTTP server on 127.0.0.1 for tests that need a real one answering (a /metrics
endpoint, a proxy in front of the API server): every method goes to one function."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def answering(respond: Callable[[BaseHTTPRequestHandler], None]) -> Iterator[str]:
    """Serve until the block ends; yields `127.0.0.1:PORT`."""

    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            respond(self)

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _any  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
