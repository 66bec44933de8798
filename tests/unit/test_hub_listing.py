"""The model downloader against a hostile or careless hub listing: a fake hub on
127.0.0.1 lists traversal names, absolute names, hashless and empty files; the real payload runs.
Nothing is written outside the destination (nor inside it, when the listing is refused), no
completion marker is set for a refused listing, and an empty file downloads."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from kimideploy.remote.payloads import hub_sync
from tests.integration.hub import Hub

REPO_ID, REVISION, TOKEN = "org/tiny", "a" * 40, "hf_test"
PAYLOAD = Path(hub_sync.__file__)


def entry(name: str, data: bytes, hashed: bool = True) -> dict[str, object]:
    found: dict[str, object] = {"rfilename": name, "size": len(data)}
    if hashed:
        found["blobId"] = hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()
    return found


def sync(hub: Hub, dest: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(PAYLOAD), "--endpoint", hub.url, "--repo", REPO_ID,
                           "--revision", REVISION, "--dest", str(dest)], input=TOKEN + "\n",
                          capture_output=True, text=True, timeout=60)  # fmt: skip


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("../outside.txt", "not a relative path inside"),
        ("sub/../../outside.txt", "not a relative path inside"),
        ("/tmp/kimideploy-hub-absolute.txt", "not a relative path inside"),
        (".kimideploy-complete", "collides with the downloader's own files"),
    ],
)
def test_names_that_leave_the_destination_are_refused_before_any_write(
    tmp_path: Path, name: str, why: str
) -> None:
    files = {"config.json": b"{}", name: b"pwned"}
    hub = Hub(REPO_ID, REVISION, files, TOKEN, set())
    hub.listing = [entry("config.json", b"{}"), entry(name, b"pwned")]
    dest = tmp_path / "models" / "dest"
    done = sync(hub, dest)
    assert done.returncode == 3, done.stderr
    assert why in done.stderr and "nothing was written" in done.stderr
    assert not dest.exists() and not (tmp_path / "models" / "outside.txt").exists()
    assert not Path("/tmp/kimideploy-hub-absolute.txt").exists()
    assert not [p for p, _, _ in hub.requests if "/resolve/" in p]


def test_a_file_without_a_hash_is_not_accepted_unchecked(tmp_path: Path) -> None:
    hub = Hub(REPO_ID, REVISION, {"model.safetensors": b"weights"}, TOKEN, set())
    hub.listing = [entry("model.safetensors", b"weights", hashed=False)]
    done = sync(hub, tmp_path / "dest")
    assert done.returncode == 3 and "the listing gives no hash" in done.stderr
    assert not (tmp_path / "dest").exists()


def test_an_empty_file_downloads_and_the_sync_completes(tmp_path: Path) -> None:
    files = {".gitattributes": b"", "config.json": b"{}"}
    hub = Hub(REPO_ID, REVISION, files, TOKEN, set())
    done = sync(hub, tmp_path / "dest")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "dest" / ".gitattributes").read_bytes() == b""
    assert (tmp_path / "dest" / hub_sync.MARKER).is_file()


def test_a_redirect_to_plain_http_drops_the_token_even_on_the_same_host() -> None:
    handler = hub_sync.SameHostAuthRedirect()
    original = urllib.request.Request(
        "https://hub.example/f", headers={"Authorization": "Bearer t"}
    )
    for target, kept in [("https://hub.example/cdn/f", True), ("http://hub.example/cdn/f", False),
                         ("https://cdn.example/f", False)]:  # fmt: skip
        new = handler.redirect_request(original, None, 302, "Found", headers={}, newurl=target)
        assert new.has_header("Authorization") is kept, target
