"""Files read from a data or models volume are untrusted input:
bounded before they are read, links refused, every problem named with an exit code. Each case
crashed `data inspect`, `drafter check --dir` or the serve pod's drafter-check init container
before (MemoryError, a hang on /dev/zero, a traceback), or passed a broken file as good."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from kimideploy.cli.main import main
from kimideploy.formats.bounded_io import UnreadableFileError, read_json_object
from kimideploy.formats.safetensors_files import safetensors_problem
from kimideploy.services.data.inspection import inspect, summary
from kimideploy.services.preflight import placement_refused
from tests.unit.test_drafter_check import drafter_dir, write_safetensors


def raw_safetensors(path: Path, header: dict[str, Any], data: bytes) -> Path:
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)
    return path


def test_a_header_that_claims_three_gigabytes_is_refused_without_reading_it(tmp_path: Path) -> None:
    path = tmp_path / "big.safetensors"
    path.write_bytes(struct.pack("<Q", 3 * 1024**3) + b"{}")
    problem, _ = safetensors_problem(path)
    assert problem == "header claims 3,221,225,472 bytes, over the 104,857,600-byte limit"


def test_overlapping_tensors_are_not_a_good_file(tmp_path: Path) -> None:
    header = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
              "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}  # fmt: skip
    problem, _ = safetensors_problem(
        raw_safetensors(tmp_path / "o.safetensors", header, b"\0" * 24)
    )
    assert problem == "tensors a and b overlap"
    outside = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
               "b": {"dtype": "F32", "shape": [2], "data_offsets": [40, 48]}}  # fmt: skip
    problem, _ = safetensors_problem(
        raw_safetensors(tmp_path / "x.safetensors", outside, b"\0" * 24)
    )
    assert problem is not None and problem.startswith("truncated: tensor b ends at")
    backwards = {"a": {"dtype": "F32", "shape": [0], "data_offsets": [16, 8]}}
    problem, _ = safetensors_problem(
        raw_safetensors(tmp_path / "b.safetensors", backwards, b"\0" * 16)
    )
    assert problem == "tensor a has the offsets 16-8"


def test_a_link_to_dev_zero_is_refused_not_followed(tmp_path: Path) -> None:
    link = tmp_path / "model.safetensors"
    link.symlink_to("/dev/zero")
    problem, _ = safetensors_problem(link)
    assert problem == "is a symbolic link; refusing to follow it"
    fifo = tmp_path / "fifo.json"
    import os

    os.mkfifo(fifo)
    with pytest.raises(UnreadableFileError, match="not a regular file"):
        read_json_object(fifo)  # opened without blocking, refused before any read


def test_data_inspect_names_every_hostile_file_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shard = tmp_path / "conv" / "shard-00000"
    shard.mkdir(parents=True)
    (shard / "chunk-000001.jsonl").write_text('{"id": "a"}\n')
    (shard / "chunk-000002.jsonl").symlink_to("/dev/zero")
    (shard / "manifest.json").write_text("{broken")
    (tmp_path / "conv" / "fingerprint.json").write_text("[1, 2]")
    found = summary(inspect(tmp_path / "conv"))
    problems = " | ".join(found["problems"])
    assert "chunk-000002.jsonl: is a symbolic link; refusing to follow it" in problems
    assert "manifest.json: not valid JSON" in problems
    assert "fingerprint.json: a JSON list, not an object" in problems
    assert found["samples"] == 1
    assert main(["data", "inspect", str(tmp_path / "conv")]) == 1
    assert "Traceback" not in capsys.readouterr().err


def test_drafter_check_survives_a_hostile_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = drafter_dir(tmp_path / "d")
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to("/dev/zero")
    write_safetensors(
        folder / "extra.safetensors", {"d2t": ("I64", [32000]), "t2d": ("BOOL", [163840])}
    )
    (folder / "kimideploy-lineage.json").write_bytes(b"\x00" * 10)
    code = main(["drafter", "check", "v3", "--dir", str(folder)])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err and "drafter v3 fails its check" in err
    assert "model.safetensors: is a symbolic link; refusing to follow it" in out
    assert "kimideploy-lineage.json: not valid JSON" in out
    (folder / "config.json").write_text("{half")
    code = main(["drafter", "check", "v3", "--dir", str(folder)])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err and "config.json" in out


def test_a_chunk_of_one_huge_line_is_named_in_bounded_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A chunk holding one line longer than any sample (here the limit is lowered to keep the
    test small) is corrupt, named with its line, without being parsed whole; `--sample` on a
    folder with a cut chunk shows the samples that are whole."""
    from kimideploy.formats.bounded_io import json_lines

    shard = tmp_path / "conv" / "shard-00000"
    shard.mkdir(parents=True)
    (shard / "chunk-000001.jsonl").write_text('{"id": "a"}\n' + '{"id": "' + "x" * 5000 + '"}\n')
    lines = list(json_lines(shard / "chunk-000001.jsonl", 1 << 20, line_limit=1000))
    assert [(ln.number, ln.problem) for ln in lines] == [(1, None), (2, "a line over 1,000 bytes")]
    (shard / "chunk-000002.jsonl").write_text('{"id": "b"}\n{"id": "c", "messa')  # cut mid-line
    found = summary(inspect(tmp_path / "conv"))
    assert found["samples"] == 3
    assert any("chunk-000002.jsonl:2: not a complete JSON line" in p for p in found["problems"])
    code = main(["data", "inspect", str(tmp_path / "conv"), "--sample", "3"])
    err = capsys.readouterr().err
    assert code == 2 and "--sample 3: " in err and "has 3 samples (0-based)" in err, err


def test_a_claim_still_being_bound_does_not_end_a_probes_wait() -> None:
    binding = ('unschedulable: 0/13 nodes are available: persistentvolumeclaim "kimi-k25-datasets" '
               'bound to non-existent persistentvolume "". not found')  # fmt: skip
    first_consumer = "unschedulable: 0/3 nodes are available: waiting for first consumer"
    gpus = "unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    assert not placement_refused({"p-0": binding})
    assert not placement_refused({"p-0": first_consumer})
    assert placement_refused({"p-0": gpus})
    assert placement_refused({"p-0": binding, "p-1": gpus})
    assert not placement_refused({"p-0": "ContainerCreating"})
