"""The fingerprint beside each dataset: written by the stage that makes it, checked by every run
that extends or reads it (config.fingerprints says what goes in).

`claim` is called by each shard before it writes anything: the first writes the record, the
others (and every restart) compare with it, so a dataset is only ever extended by runs with the
same inputs. `require` is what a reading stage uses: no record, or a record of other inputs, is a
refusal that names each differing field.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from kimideploy.config.fingerprints import (
    FINGERPRINT_FILE,
    FINGERPRINT_KIND,
    differences,
    fingerprint_id,
)
from kimideploy.formats.bounded_io import UnreadableFileError, read_json_object
from kimideploy.formats.chat_template import template_fingerprint
from kimideploy.workloads.runtime import TEMP_MARK, BadInputError, atomic_write

DATA_FILES = ("chunk-*.jsonl", "*.safetensors", "manifest.json")


def read(root: Path) -> dict[str, Any] | None:
    path = root / FINGERPRINT_FILE
    if not path.exists() and not path.is_symlink():
        return None
    try:
        return read_json_object(path)
    except UnreadableFileError as exc:
        raise BadInputError(
            f"{exc}: the dataset's fingerprint cannot be read, so what it was made from is unknown",
            hint=f"move {root} aside and run the stage that makes it again",
        ) from exc


def _has_data(root: Path) -> bool:
    return root.is_dir() and any(
        next(shard.glob(pattern), None) is not None
        for shard in root.glob("shard-*")
        for pattern in DATA_FILES
    )


def claim(root: Path, fields: dict[str, Any], observed: dict[str, Any]) -> dict[str, Any]:
    """Record what makes the dataset at `root`, or confirm a run with the same inputs resumes it."""
    record = {
        "kind": FINGERPRINT_KIND,
        "id": fingerprint_id(fields),
        "fields": fields,
        "observed": observed,
    }
    existing = read(root)
    if existing is None:
        if _has_data(root):
            raise BadInputError(
                f"{root} holds data without a fingerprint (written by an older kimideploy), so "
                "whether it was made from these inputs is unknown; nothing was written",
                hint=f"move {root} aside (or delete it) and run again",
            )
        root.mkdir(parents=True, exist_ok=True)
        if _create_exclusively(root / FINGERPRINT_FILE, record):
            return record
        existing = read(root)  # another shard or run wrote it first: it must be ours
        assert existing is not None
    changed = differences(
        {"fields": existing.get("fields"), "observed": existing.get("observed")},
        {"fields": fields, "observed": observed},
    )
    if changed:
        raise BadInputError(
            f"{root} was made from other inputs, so this run would mix two datasets; nothing was "
            "written. Differences: " + "; ".join(changed),
            hint="a changed setting gets its own folder when the run is rendered again "
            "(`kimideploy run ...`); a file that changed in place (the prompt set, the synced "
            f"model) needs a new name, or {root} moved aside",
        )
    return existing


def _create_exclusively(path: Path, record: dict[str, Any]) -> bool:
    """Write the whole record beside `path`, then link it into place: the link fails if another
    writer got there first (False), and no reader ever sees half a record."""
    partial = path.with_name(f".{path.name}{TEMP_MARK}{os.getpid()}-{time.monotonic_ns()}")
    atomic_write(partial, json.dumps(record, indent=2, sort_keys=True).encode())
    try:
        os.link(partial, path)
    except FileExistsError:
        return False
    finally:
        partial.unlink(missing_ok=True)
    return True


def require(root: Path, what: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The record of a dataset this stage reads; its fields must be the ones the spec expects."""
    record = read(root)
    if record is None:
        raise BadInputError(
            f"{root}: the {what} have no fingerprint (made by an older kimideploy, or the stage "
            "that makes them has not run), so what they were made from is unknown",
            hint=f"run the stage that makes the {what} (`kimideploy run ...`): it writes them "
            "with their fingerprint",
        )
    if fields:
        changed = differences(record.get("fields") or {}, fields)
        if changed:
            raise BadInputError(
                f"{root}: the {what} were made from other inputs than this run expects: "
                + "; ".join(changed),
                hint=f"render this run again, or make the {what} for these settings first",
            )
    return record


def rendering_inputs(
    conversations_dir: Path, expected_id: str | None, tokenizer: Any
) -> dict[str, Any]:
    """What a stage that renders conversations records as observed: which conversations (their
    recorded fingerprint, which must be the one the plan named) and which template."""
    record = require(conversations_dir, "conversations", {})
    if expected_id and record.get("id") != expected_id:
        raise BadInputError(
            f"{conversations_dir}: its fingerprint is {record.get('id')}, this run expects "
            f"conversations {expected_id}; the folder was copied or renamed",
            hint="render the run again so that it names the folder its inputs make",
        )
    return {"conversations": record.get("id"), **template_fingerprint(tokenizer)}
