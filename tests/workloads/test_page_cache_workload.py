"""The page-cache pods' one reader (workloads/page_cache.py), run as the pods run it: the storage
probe reads its sample cold and reports GB/s, the warmer reads every file, and the node-local
copy is whole (the marker last), resumable where it stopped, and leaves links alone. The Jobs
that run it: plan/page_cache.py; the probe's result on the control plane:
tests/integration/test_weights_on_the_cluster.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import REPO

MIB = 1 << 20


def reader(*args: str) -> tuple[int, list[dict[str, Any]], str]:
    done = subprocess.run(
        [sys.executable, "-m", "kimideploy.workloads.page_cache", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        timeout=120,
        check=False,
    )
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return done.returncode, events, done.stderr


def checkpoint(folder: Path, sizes_mib: dict[str, int]) -> Path:
    folder.mkdir(parents=True)
    for name, size in sizes_mib.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(os.urandom(size * MIB))
    (folder / ".kimideploy-complete").write_text("synced\n")
    return folder


def test_the_probe_reads_its_sample_cold_and_reports_the_bandwidth(tmp_path: Path) -> None:
    model = checkpoint(tmp_path / "model", {"a.safetensors": 8, "b.safetensors": 8,
                                            "c.safetensors": 8})  # fmt: skip
    code, events, err = reader("probe", str(model), "--sample-gb", "0.01", "--threads", "2")
    assert code == 0, err
    result = events[-1]
    assert result["event"] == "result" and result["stage"] == "probe"
    # About 10 MB asked: whole files, at least one, never the whole checkpoint.
    assert result["bytes"] in (8 * MIB, 16 * MIB) and result["gbps"] > 0


def test_the_warmer_reads_every_file(tmp_path: Path) -> None:
    model = checkpoint(tmp_path / "model", {"a.safetensors": 4, "sub/b.bin": 0, "c.json": 1})
    code, events, err = reader("warm", str(model), "--threads", "3")
    assert code == 0, err
    assert events[-1]["bytes"] == 5 * MIB


def test_a_missing_folder_is_bad_input(tmp_path: Path) -> None:
    code, _, err = reader("probe", str(tmp_path / "nowhere"), "--sample-gb", "1")
    assert code == 2 and "nowhere" in err


def test_the_copy_is_whole_and_goes_on_where_it_stopped(tmp_path: Path) -> None:
    model = checkpoint(tmp_path / "model", {"a.safetensors": 6, "b.safetensors": 6, "c.json": 1})
    local = tmp_path / "nvme" / "model"
    # A copy cut off: a finished file, a partial one, no marker.
    local.mkdir(parents=True)
    (local / "a.safetensors").write_bytes((model / "a.safetensors").read_bytes())
    os.utime(local / "a.safetensors", (1, 1))
    (local / "b.safetensors.kimideploy-partial").write_bytes(b"half")
    (local / "c.json").write_bytes(b"other size")
    code, events, err = reader("copy", str(model), "--to", str(local), "--threads", "2")
    assert code == 0, err
    for name in ("a.safetensors", "b.safetensors", "c.json"):
        assert (local / name).read_bytes() == (model / name).read_bytes(), name
    assert (local / "a.safetensors").stat().st_mtime == 1  # whole already: not copied again
    assert not list(local.glob("*kimideploy-partial"))
    assert (local / ".kimideploy-complete").is_file()
    assert events[-1]["stage"] == "copy" and events[-1]["bytes"] == 13 * MIB


def test_links_in_the_checkpoint_are_not_followed(tmp_path: Path) -> None:
    model = checkpoint(tmp_path / "model", {"a.safetensors": 2})
    (tmp_path / "secret").write_bytes(b"x" * MIB)
    (model / "planted.safetensors").symlink_to(tmp_path / "secret")
    code, events, err = reader("warm", str(model))
    assert code == 0, err
    assert events[-1]["bytes"] == 2 * MIB
