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

from kimideploy.formats.hub_download import downloader_command
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
    """The command line both callers build (formats/hub_download.py), with the test's small
    pieces and frequent records."""
    built = downloader_command(sys.executable, str(PAYLOAD), endpoint=hub.url, repo=REPO,
                               revision=REVISION, dest=str(dest), streams=streams)  # fmt: skip
    return [*built, "--piece-bytes", str(PIECE), "--record-every", str(RECORD)]


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


def weights_spec(where: Path, hub: Hub, token_file: Path | None) -> Path:
    """What `host sync-model` renders for a rented cluster's download Job, its paths local."""
    from kimideploy.config.specs import TargetRef, WeightsSpec, WeightsTarget

    target = TargetRef(repo=REPO, revision=REVISION, served_name="m", path=str(where / "m"),
                       num_hidden_layers=2, hidden_size=64, vocab_size=256)  # fmt: skip
    spec = WeightsSpec(run_id="w1", cluster="b300", target=target, endpoint=hub.url, streams=4,
                       targets=[WeightsTarget(repo=REPO, revision=REVISION,
                                              dest=str(where / "models" / "hub" / REPO / REVISION))],
                       token_file=str(token_file) if token_file else None)  # fmt: skip
    where.mkdir(parents=True, exist_ok=True)
    path = where / "spec.json"
    path.write_text(spec.model_dump_json())
    return path


def run_weights(spec: Path) -> subprocess.CompletedProcess[str]:
    from tests.conftest import REPO as ROOT

    return subprocess.run([sys.executable, "-m", "kimideploy.workloads", "weights", "--spec",
                           str(spec)], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})  # fmt: skip


def test_the_download_job_fills_the_shared_claim_with_the_same_verified_downloader(
    tmp_path: Path, hub: Hub
) -> None:
    """The weights Job's pod: the token from the mounted Secret file, sent on stdin; every file
    verified; the marker the serve pod and the weights probe look for written last."""
    token = tmp_path / "secret" / "token"
    token.parent.mkdir()
    token.write_text(TOKEN + "\n")
    done = run_weights(weights_spec(tmp_path, hub, token))
    assert done.returncode == 0, done.stderr[-2000:]
    dest = tmp_path / "models" / "hub" / REPO / REVISION
    assert_complete(hub, dest)
    assert (dest / ".kimideploy-complete").is_file()
    result = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")][-1]
    assert result == {"event": "result", "stage": "weights",
                      "synced": [{"repo": REPO, "revision": REVISION, "dest": str(dest)}]}  # fmt: skip
    assert all(auth == f"Bearer {TOKEN}" for _, _, auth in hub.requests)
    assert TOKEN not in done.stdout + done.stderr


def test_a_refused_token_fails_the_download_index_at_once(tmp_path: Path, hub: Hub) -> None:
    token = tmp_path / "token"
    token.write_text("hf_wrong\n")
    done = run_weights(weights_spec(tmp_path, hub, token))
    assert done.returncode == 2, done.stderr[-2000:]  # bad input: the Job fails the index at once
    assert "the hub refused the token" in done.stderr
    missing = run_weights(weights_spec(tmp_path / "x", hub, tmp_path / "absent"))
    assert missing.returncode == 2 and "the hub token cannot be read" in missing.stderr


def test_links_planted_in_the_model_folder_are_never_written_through(
    hub: Hub, tmp_path: Path
) -> None:
    """Whoever can write the model folder plants links where the downloader's own files go: the
    victims they point at are untouched, the links are replaced by real files."""
    dest, victims = tmp_path / "m", tmp_path / "home"
    dest.mkdir()
    victims.mkdir()
    planted = {
        "model-00001.safetensors.part": "precious 1",  # adopted as a resumable prefix before
        "model-00002.safetensors.part.journal": "precious 2",
        ".kimideploy-verified.json.tmp": "precious 3",
        ".kimideploy-complete": "precious 4",
        ".kimideploy-verified.json": "precious 5",
        "config.json": "precious 6",  # a finished file that is a link is not the file
    }
    for number, (name, text) in enumerate(planted.items()):
        victim = victims / f"victim-{number}"
        victim.write_text(text)
        (dest / name).symlink_to(victim)
    done = sync(hub, dest)
    assert done.returncode == 0, done.stderr
    assert_complete(hub, dest)
    for number, text in enumerate(planted.values()):
        assert (victims / f"victim-{number}").read_text() == text
    assert not [p for p in dest.rglob("*") if p.is_symlink()]


def test_a_second_sync_of_the_same_folder_is_refused_by_name(hub: Hub, tmp_path: Path) -> None:
    import fcntl
    import os

    dest = tmp_path / "m"
    dest.mkdir()
    fd = os.open(dest / ".kimideploy-sync.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        done = sync(hub, dest)
    finally:
        os.close(fd)
    assert done.returncode == 5 and "another sync is writing" in done.stderr
    assert sorted(p.name for p in dest.iterdir()) == [".kimideploy-sync.lock"]  # no journals
    assert sync(hub, dest).returncode == 0


@pytest.mark.parametrize("entry", ["[0, 1e400]", "[0, -5]", '[0, "x"]', "[99, 1]", "[true, 1]"])
def test_a_journal_with_impossible_numbers_starts_the_file_over(
    hub: Hub, tmp_path: Path, entry: str
) -> None:
    dest = tmp_path / "m"
    dest.mkdir()
    name = "model-00002.safetensors"
    data = hub.files[name]
    (dest / f"{name}.part").write_bytes(b"\0" * len(data))
    header = {"size": len(data), "hash": hashlib.sha256(data).hexdigest(), "piece": PIECE}
    (dest / f"{name}.part.journal").write_text(f"{json.dumps(header)}\n{entry}\n[1, 5]\n")
    done = sync(hub, dest)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert_complete(hub, dest)


@pytest.mark.parametrize(
    ("listing", "why"),
    [
        ([{"rfilename": "a.bin", "size": 10**400, "blobId": "0" * 40}], "no usable size"),
        ([{"rfilename": "a.bin", "size": -1, "blobId": "0" * 40}], "no usable size"),
        ([{"rfilename": "a.bin", "size": "many", "blobId": "0" * 40}], "no usable size"),
        (["a.bin"], "entry 0 of the listing is a str"),
    ],
)
def test_a_listing_with_impossible_numbers_is_refused_before_any_write(
    hub: Hub, tmp_path: Path, listing: list[object], why: str
) -> None:
    hub.listing = listing  # type: ignore[assignment]
    done = sync(hub, tmp_path / "m")
    assert done.returncode == 3 and why in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "m").exists()


def test_a_range_answered_from_another_offset_falls_back_to_one_stream(
    hub: Hub, tmp_path: Path
) -> None:
    hub.ranges_from_zero = True
    done = sync(hub, tmp_path / "m")
    assert done.returncode == 0, done.stderr
    assert_complete(hub, tmp_path / "m")
