"""The host's downloader (remote/payloads/hub_sync.py) against a local hub: parallel pieces over
several files, a hard kill and a restart that fetches no recorded range twice and misses none,
a server without ranges, and mirrors that send more than the listing says. Run as the host runs
it: `python3 hub_sync.py ...` with the token on stdin."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest

from tests.integration.hub import Hub

PAYLOAD = Path(str(resources.files("kimideploy.remote.payloads") / "hub_sync.py"))
REPO, REVISION, TOKEN = "org/model", "a" * 40, "hf_test_token"
MIB = 1024 * 1024
PIECE, RECORD = MIB, 256 * 1024


def blob(seed: int, size: int) -> bytes:
    out, counter = bytearray(), 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}-{counter}".encode()).digest()
        counter += 1
    return bytes(out[:size])


@pytest.fixture
def hub() -> Iterator[Hub]:
    files = {"config.json": b'{"model_type": "kimi_k25"}\n',
             "model-00001.safetensors": blob(1, 5 * MIB + 123),
             "model-00002.safetensors": blob(2, 3 * MIB),
             "nested/tokenizer.model": blob(3, 200_000)}  # fmt: skip
    server = Hub(REPO, REVISION, files, TOKEN, lfs={n for n in files if n.endswith(".safetensors")})
    yield server
    server.stop()


def command(hub: Hub, dest: Path, streams: int) -> list[str]:
    return [sys.executable, str(PAYLOAD), "--endpoint", hub.url, "--repo", REPO,
            "--revision", REVISION, "--dest", str(dest), "--streams", str(streams),
            "--piece-bytes", str(PIECE), "--record-every", str(RECORD)]  # fmt: skip


def sync(hub: Hub, dest: Path, streams: int = 4) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command(hub, dest, streams), input=TOKEN + "\n", capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def assert_complete(hub: Hub, dest: Path) -> None:
    for name, data in hub.files.items():
        assert (dest / name).read_bytes() == data, name
    marker = json.loads((dest / ".kimideploy-complete").read_text())
    assert marker["files"] == len(hub.files) and marker["revision"] == REVISION
    assert not list(dest.rglob("*.part")) and not list(dest.rglob("*.journal"))


def test_pieces_of_several_files_download_in_parallel_and_verify(hub: Hub, tmp_path: Path) -> None:
    done = sync(hub, tmp_path / "m", streams=4)
    assert done.returncode == 0, done.stderr
    assert_complete(hub, tmp_path / "m")
    big = sorted((s, e) for n, s, e in hub.served if n == "model-00001.safetensors")
    assert big == [(i * MIB, min((i + 1) * MIB, 5 * MIB + 123)) for i in range(6)]  # each once
    progress = [json.loads(line) for line in done.stdout.splitlines() if '"progress"' in line]
    assert progress[-1]["done"] == progress[-1]["total"] == sum(map(len, hub.files.values()))
    assert progress[-1]["rate"] > 0 and "eta_s" in progress[-1]
    again = sync(hub, tmp_path / "m")
    assert again.returncode == 0 and len(hub.served) == len(big) + 5  # nothing fetched twice


def recorded(dest: Path) -> dict[str, dict[int, int]]:
    """Each unfinished file's journal: piece -> recorded bytes."""
    out: dict[str, dict[int, int]] = {}
    for journal in dest.rglob("*.part.journal"):
        name = str(journal.relative_to(dest)).removesuffix(".part.journal")
        pieces: dict[int, int] = {}
        for line in journal.read_text().splitlines()[1:]:
            piece, done = json.loads(line)
            pieces[piece] = max(pieces.get(piece, 0), done)
        out[name] = pieces
    return out


def test_a_killed_download_resumes_every_piece_where_it_was_recorded(
    hub: Hub, tmp_path: Path
) -> None:
    hub.per_connection_bytes_per_s = 1.5 * MIB
    dest = tmp_path / "m"
    process = subprocess.Popen(command(hub, dest, 4), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)  # fmt: skip
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(TOKEN + "\n")
    process.stdin.close()
    total = sum(map(len, hub.files.values()))
    for line in process.stdout:
        if '"progress"' in line and json.loads(line)["done"] > 0.4 * total:
            process.send_signal(signal.SIGKILL)  # no chance to clean up or record anything
            break
    process.wait(timeout=30)
    time.sleep(0.5)  # let the server threads notice the closed connections
    at_kill = recorded(dest)
    assert at_kill, "the kill came after the last file finished: slow the hub down"
    before = len(hub.served)
    hub.per_connection_bytes_per_s = None
    done = sync(hub, dest)
    assert done.returncode == 0, done.stderr
    assert_complete(hub, dest)
    for name, start, _ in hub.served[before:]:
        if name in at_kill:
            piece = start // PIECE
            # never before what was recorded; a piece recorded whole is not asked for again
            assert start == piece * PIECE + at_kill[name].get(piece, 0), (name, start)
            assert at_kill[name].get(piece, 0) < min(PIECE, len(hub.files[name]) - piece * PIECE)
    # What was fetched twice is bounded by the unrecorded tail of the pieces in flight.
    fetched = sum(end - start for _, start, end in hub.served)
    assert fetched <= total + 4 * (RECORD + MIB)


def test_a_server_that_ignores_ranges_gets_one_stream_per_file(hub: Hub, tmp_path: Path) -> None:
    hub.ignore_ranges = True
    done = sync(hub, tmp_path / "m")
    assert done.returncode == 0, done.stderr
    assert_complete(hub, tmp_path / "m")


def test_a_mirror_that_sends_more_than_listed_is_refused(hub: Hub, tmp_path: Path) -> None:
    hub.ignore_ranges = True
    hub.extra_bytes = b"x" * 4096
    done = sync(hub, tmp_path / "m")
    assert done.returncode == 3
    assert "sent more than the listed" in done.stderr
    assert not (tmp_path / "m" / ".kimideploy-complete").exists()


def test_a_range_of_a_file_of_another_size_is_refused(hub: Hub, tmp_path: Path) -> None:
    hub.extra_bytes = b"x" * 10  # Content-Range now names a larger total than the listing
    done = sync(hub, tmp_path / "m")
    assert done.returncode == 3
    assert "the server says the file has" in done.stderr
    assert not (tmp_path / "m" / ".kimideploy-complete").exists()
