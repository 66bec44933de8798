"""A local download mirror on 127.0.0.1 for the provisioning playbooks (hosts may be air-gapped)."""

from __future__ import annotations

import hashlib
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def build_mirror(root: Path, k3s_version: str) -> Path:
    """The files the gpu_host role downloads, at the paths the real sites use."""
    files = {
        "cuda/debian12/x86_64/cuda-keyring_1.1-1_all.deb": b"not a real package: check mode never installs it\n",
        "cuda/ubuntu2404/x86_64/cuda-keyring_1.1-1_all.deb": b"not a real package\n",
        "toolkit/gpgkey": b"-----BEGIN PGP PUBLIC KEY BLOCK-----\ntest\n-----END PGP PUBLIC KEY BLOCK-----\n",
    }
    binary = b"#!/bin/sh\necho k3s test binary\n"
    files[f"k3s/{k3s_version}/k3s"] = binary
    files[f"k3s/{k3s_version}/sha256sum-amd64.txt"] = (
        f"{hashlib.sha256(binary).hexdigest()}  k3s\n".encode()
    )
    for relative, data in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


class Mirror:
    def __init__(self, root: Path) -> None:
        handler: Any = lambda *args, **kw: _Quiet(*args, directory=str(root), **kw)  # noqa: E731
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass
