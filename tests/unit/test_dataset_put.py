"""`data put`: the bytes travel in ConfigMaps under the API server's object limit and in order;
the pod's script (run here with the real sh and coreutils) writes, verifies and renames, leaves
the same file alone, and never replaces another unless asked."""

from __future__ import annotations

import base64
import hashlib
import subprocess
from pathlib import Path

import pytest

from kimideploy.config.loading import LoadedProject
from kimideploy.errors import UsageError
from kimideploy.plan.dataset_upload import CHUNK_BYTES, MAX_BYTES, SCRIPT, upload
from kimideploy.plan.model import PlanRequest
from kimideploy.plan.resolve import plan_inputs


def _run(dest: Path, data_parts: list[bytes], want: str, mode: str, tmp: Path) -> tuple[int, str]:
    parts = tmp / "parts"
    parts.mkdir(exist_ok=True)
    for old in parts.iterdir():
        old.unlink()
    for index, chunk in enumerate(data_parts):
        (parts / f"{index:05d}").write_bytes(chunk)
    done = subprocess.run(["sh", "-c", SCRIPT, "put", str(dest), want, mode, str(parts), str(tmp)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    return done.returncode, done.stdout.strip().splitlines()[-1]


def test_the_pod_script_writes_verifies_and_never_replaces_unasked(tmp_path: Path) -> None:
    dest = tmp_path / "volume" / "prompts" / "mixed-v1.jsonl"
    data = b'{"prompt": "a"}\n' * 5000
    chunks = [data[i : i + 7000] for i in range(0, len(data), 7000)]
    digest = hashlib.sha256(data).hexdigest()
    assert _run(dest, chunks, digest, "keep", tmp_path) == (0, f"wrote {dest} {digest}")
    assert dest.read_bytes() == data
    assert _run(dest, chunks, digest, "keep", tmp_path) == (0, f"present {dest} {digest}")
    other = b"other\n"
    other_digest = hashlib.sha256(other).hexdigest()
    code, last = _run(dest, [other], other_digest, "keep", tmp_path)
    assert (code, last) == (3, f"conflict {dest} {digest}") and dest.read_bytes() == data
    code, last = _run(dest, [other], "0" * 64, "replace", tmp_path)  # corrupt in transit
    assert code == 1 and last.startswith("corrupt ") and dest.read_bytes() == data
    assert sorted(p.name for p in dest.parent.iterdir()) == ["mixed-v1.jsonl"]
    assert _run(dest, [other], other_digest, "replace", tmp_path) == (
        0,
        f"wrote {dest} {other_digest}",
    )
    assert dest.read_bytes() == other


def test_the_parts_carry_the_file_in_order_under_the_object_limit(example: LoadedProject) -> None:
    ctx = plan_inputs(example, PlanRequest("datagen", "b300"))
    data = bytes(range(256)) * (3 * CHUNK_BYTES // 256 + 7)
    planned = upload(ctx, "prompts/mine.jsonl", data, replace=False)
    assert len(planned.parts) == 4 and planned.destination == "/data/prompts/mine.jsonl"
    joined = b"".join(base64.b64decode(p["binaryData"]["part"]) for p in planned.parts)
    assert joined == data and planned.sha256 == hashlib.sha256(data).hexdigest()
    assert all(len(p["binaryData"]["part"]) < 1024 * 1024 for p in planned.parts)
    values = planned.job.values
    upload_volume = next(v for v in values["volumes"] if v["name"] == "upload")
    order = [s["configMap"]["items"][0]["path"] for s in upload_volume["projected"]["sources"]]
    assert order == ["00000", "00001", "00002", "00003"]
    claims = [v["persistentVolumeClaim"]["claimName"] for v in values["volumes"]
              if "persistentVolumeClaim" in v]  # fmt: skip
    assert claims == [ctx.claim_name("datasets")]
    assert values["args"][:3] == ["/data/prompts/mine.jsonl", planned.sha256, "keep"]


@pytest.mark.parametrize("bad", ["../etc/passwd", "/data/x.jsonl", "prompts/", ""])
def test_a_path_off_the_volume_is_refused(example: LoadedProject, bad: str) -> None:
    ctx = plan_inputs(example, PlanRequest("datagen", "b300"))
    with pytest.raises(UsageError, match="relative to the datasets volume"):
        upload(ctx, bad, b"x", replace=False)
    with pytest.raises(UsageError, match="carries at most"):
        upload(ctx, "p.jsonl", b"x" * (MAX_BYTES + 1), replace=False)


def _script(args: list[str]) -> tuple[int, str]:
    done = subprocess.run(["sh", "-c", SCRIPT, "put", *args], capture_output=True, text=True,
                          check=False)  # fmt: skip
    return done.returncode, (done.stdout.strip().splitlines() or [""])[-1]


def test_links_planted_on_the_volume_are_refused_not_written_through(tmp_path: Path) -> None:
    volume, outside = tmp_path / "volume", tmp_path / "outside"
    (volume / "prompts").mkdir(parents=True)
    outside.mkdir()
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "00000").write_bytes(b"x\n")
    digest = hashlib.sha256(b"x\n").hexdigest()
    # The destination itself a link, a folder on the way a link, the old fixed temporary name.
    (volume / "prompts" / "a.jsonl").symlink_to(outside / "victim")
    (volume / "elsewhere").symlink_to(outside)
    (volume / "prompts" / "b.jsonl.part").symlink_to(outside / "victim-part")
    for dest, named in [(volume / "prompts" / "a.jsonl", "a.jsonl"),
                        (volume / "elsewhere" / "c.jsonl", "elsewhere")]:  # fmt: skip
        code, last = _script([str(dest), digest, "replace", str(parts), str(volume)])
        assert code == 1 and last.startswith("link ") and named in last, last
    code, last = _script([str(volume / "prompts" / "b.jsonl"), digest, "replace", str(parts),
                          str(volume)])  # fmt: skip
    assert (code, last) == (0, f"wrote {volume / 'prompts' / 'b.jsonl'} {digest}")
    assert list(outside.iterdir()) == []  # nothing written through any link
    (volume / "prompts" / "d.jsonl").mkdir()
    code, last = _script([str(volume / "prompts" / "d.jsonl"), digest, "replace", str(parts),
                          str(volume)])  # fmt: skip
    assert code == 1 and last.startswith("notfile "), last


def test_overlapping_replacements_each_report_what_the_path_holds(tmp_path: Path) -> None:
    volume = tmp_path / "volume"
    volume.mkdir()
    dest = volume / "p.jsonl"
    procs = []
    for index in range(4):
        parts = tmp_path / f"parts{index}"
        parts.mkdir()
        data = bytes([65 + index]) * (3 << 20)
        (parts / "00000").write_bytes(data)
        args = [str(dest), hashlib.sha256(data).hexdigest(), "replace", str(parts), str(volume)]
        procs.append(subprocess.Popen(["sh", "-c", SCRIPT, "put", *args], text=True,
                                      stdout=subprocess.PIPE))  # fmt: skip
    lasts = [p.communicate()[0].strip().splitlines()[-1] for p in procs]
    final = hashlib.sha256(dest.read_bytes()).hexdigest()
    wanted = {hashlib.sha256(bytes([65 + i]) * (3 << 20)).hexdigest() for i in range(4)}
    assert final in wanted  # one upload's bytes whole, never a mixture
    assert all(last.split()[0] in ("wrote", "raced") for last in lasts), lasts  # none corrupt
    # Whoever says "wrote" read its own bytes back under the name.
    assert all(last.split()[-1] in wanted for last in lasts), lasts
    assert sorted(p.name for p in volume.iterdir()) == ["p.jsonl"]  # no temporary left
