"""weights: the pinned checkpoint (and the hub drafters) downloaded into the models claim the pods
mount, on a cluster whose pods read a shared filesystem (the rented NVL8 clusters).

The download is the one `host sync-model` runs over SSH on a host (remote/payloads/hub_sync.py:
standard library only, parallel over files and byte ranges, resumable from its journals, every
file checked against its sha256 before it is renamed into place, the completion marker written
last). It runs here as a file, not an import: the package it ships in is the SSH side's. The
token comes from the model's hf_token Secret, mounted as a file, and reaches the downloader on
stdin only.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kimideploy
from kimideploy.config.specs import WeightsSpec
from kimideploy.formats.hub_download import downloader_command
from kimideploy.workloads.runtime import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    BadInputError,
    emit,
    log,
)

DOWNLOADER = Path(kimideploy.__file__).parent / "remote" / "payloads" / "hub_sync.py"
DOWNLOADER_EXIT = {2: EXIT_BAD_INPUT, 3: EXIT_FAILED, 4: EXIT_FAILED}
"""The downloader's exit codes (refused, verification failed, network) as the Job reads them:
a refused token or an unknown revision fails the index at once; the others are retried, and a
retried pod resumes every file from where it stopped."""


def run(spec: WeightsSpec) -> int:
    token = _token(spec)
    done = []
    for target in spec.targets:
        log(f"downloading {target.repo}@{target.revision[:12]} into {target.dest}")
        command = downloader_command(
            sys.executable,
            str(DOWNLOADER),
            endpoint=spec.endpoint,
            repo=target.repo,
            revision=target.revision,
            dest=target.dest,
            streams=spec.streams,
        )
        process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(token + "\n")
        process.stdin.close()
        for line in process.stdout:  # its progress lines are this pod's
            print(line, end="", flush=True)
        code = process.wait()
        if code != 0:
            log(f"{target.repo}@{target.revision[:12]}: the download stopped (exit {code})")
            return DOWNLOADER_EXIT.get(code, EXIT_FAILED)
        done.append({"repo": target.repo, "revision": target.revision, "dest": target.dest})
    emit({"event": "result", "stage": "weights", "synced": done})
    return EXIT_OK


def _token(spec: WeightsSpec) -> str:
    """The mounted Secret's token; none for a public model (model.hf_token unset)."""
    if spec.token_file is None:
        return ""
    try:
        return Path(spec.token_file).read_text().strip()
    except OSError as exc:
        raise BadInputError(
            f"{spec.token_file}: the hub token cannot be read ({exc.strerror})",
            hint="create the Secret model.hf_token names in the cluster's namespace",
        ) from exc
