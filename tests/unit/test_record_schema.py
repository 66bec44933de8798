"""Release records carry a schema version: a reader ignores fields a newer minor
added and refuses a newer major with a clear message, never a traceback."""

from __future__ import annotations

import base64
import gzip
import json
from dataclasses import asdict
from typing import Any

import pytest

from kimideploy.cluster import records
from kimideploy.errors import UsageError


def secret(**changes: Any) -> dict[str, Any]:
    record = records.ReleaseRecord(
        release="kimi-k25-serve", revision=3, status="deployed", created_at="2026-12-01T00:00:00Z",
        user="ops", cluster="b300", namespace="kimi", drafter="v3", image="sha256:" + "a" * 64,
        config_sha256="b" * 64, config_text="name: kimi-k25\\n", overrides=[], manifests=[],
    )  # fmt: skip
    data = {**asdict(record), **changes}
    raw = base64.b64encode(gzip.compress(json.dumps(data).encode())).decode()
    return {"metadata": {"name": "kimideploy.release.kimi-k25-serve.v3",
                         "labels": {"kimideploy.io/revision": "3"}},
            "data": {"release": raw}}  # fmt: skip


def decode(item: dict[str, Any]) -> records.ReleaseRecord:
    return records._decode(item, "kimi", "kimi-k25-serve")


def test_a_record_written_now_carries_the_schema_and_reads_back() -> None:
    record = decode(secret())
    assert record.schema == records.SCHEMA and record.revision == 3


def test_unknown_fields_of_a_newer_minor_are_ignored() -> None:
    record = decode(secret(schema="1.7", canary_weight=0.1))
    assert record.drafter == "v3" and not hasattr(record, "canary_weight")


def test_a_record_from_before_the_field_reads_as_1_0() -> None:
    data = secret()
    raw = json.loads(gzip.decompress(base64.b64decode(data["data"]["release"])))
    del raw["schema"]
    data["data"]["release"] = base64.b64encode(gzip.compress(json.dumps(raw).encode())).decode()
    assert decode(data).revision == 3


def test_a_newer_major_is_refused_with_what_to_do() -> None:
    with pytest.raises(UsageError) as caught:
        decode(secret(schema="2.0"))
    assert (
        "kimideploy.release.kimi-k25-serve.v3 was written by a newer kimideploy (record schema "
        "2.0; this one reads 1.x)" in caught.value.message
    )
    assert caught.value.exit_code == 2 and "upgrade kimideploy" in (caught.value.hint or "")


def test_a_record_from_before_the_workload_field_is_a_serve_release() -> None:
    data = secret(schema="1.1")
    raw = json.loads(gzip.decompress(base64.b64decode(data["data"]["release"])))
    del raw["workload"]
    data["data"]["release"] = base64.b64encode(gzip.compress(json.dumps(raw).encode())).decode()
    assert decode(data).workload == "serve"
    assert decode(secret(workload="serve")).workload == "serve"
