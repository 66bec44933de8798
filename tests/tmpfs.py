"""A real small or read-only filesystem for tests of full and unwritable volumes: a tmpfs
mounted over a folder for the block's length. CI runs as root, where the mount works, so there a
failure to mount fails the test; elsewhere it is a skip that says why."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(folder: Path, options: str) -> Iterator[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                             capture_output=True, text=True, check=False)  # fmt: skip
    if mounted.returncode != 0:
        why = f"cannot mount a tmpfs here: {mounted.stderr.strip()}"
        if os.environ.get("KIMIDEPLOY_REQUIRE_PIPELINE") == "1":
            pytest.fail(why)
        pytest.skip(why)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)
