"""Dataset fingerprints: what produced a dataset, shared by the plan (which names the folder) and
the pods (which record it beside the data and refuse to mix).

A fingerprint is a JSON object of the inputs that change the data. Its id (12 hex of the sha256 of
the canonical JSON) names the folder, so changed inputs can never land on old data: changing the
layer ids, the model revision, the sampling, the prompt set or the shard layout makes a new folder,
and the same inputs resume the old one. The pods add what only they can see (the prompt file's
content hash, the tokenizer's and chat template's hashes) and compare with the record.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

FINGERPRINT_FILE = "fingerprint.json"
FINGERPRINT_KIND = "kimideploy.dataset-fingerprint.v1"


def fingerprint_id(fields: dict[str, Any]) -> str:
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def flatten(fields: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}, so differences can name the field."""
    flat: dict[str, Any] = {}
    for key, value in fields.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """'field: recorded X, now Y' for every field that differs (missing counts as differing)."""
    old, new = flatten(recorded), flatten(current)
    return [
        f"{key}: recorded {json.dumps(old.get(key))}, now {json.dumps(new.get(key))}"
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key)
    ]
