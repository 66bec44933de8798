"""k8s/rendered/ is the committed rendering of the example config; stale files fail with a diff.

Regenerate with `scripts/update-golden` and review the diff.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path

from kimideploy.services.rendering import (
    CONFIG_REFERENCE_FILE,
    GOLDEN_DIR,
    SCHEMA_FILE,
    config_json_schema,
    config_reference,
    golden_files,
)
from tests.conftest import EXAMPLE, REPO


def _diff(path: Path, expected: str) -> str:
    actual = (REPO / path).read_text() if (REPO / path).is_file() else ""
    return "".join(
        difflib.unified_diff(
            actual.splitlines(keepends=True), expected.splitlines(keepends=True),
            fromfile=f"{path} (committed)", tofile=f"{path} (rendered now)",
        )
    )  # fmt: skip


def test_golden_manifests_are_fresh() -> None:
    expected = golden_files(EXAMPLE)
    committed = {p.relative_to(REPO) for p in (REPO / GOLDEN_DIR).rglob("*.yaml")}
    diffs = [_diff(path, text) for path, text in expected.items()]
    diffs = [d for d in diffs if d]
    extra = committed - set(expected)
    assert not extra, (
        f"stale golden files with no rendering: {sorted(map(str, extra))}; run scripts/update-golden"
    )
    assert not diffs, (
        "golden files are stale; run scripts/update-golden\n" + "\n".join(diffs)[:20000]
    )


def test_committed_json_schema_is_fresh() -> None:
    diff = _diff(SCHEMA_FILE, config_json_schema())
    assert not diff, (
        "schema/kimideploy.schema.json is stale; run scripts/update-golden\n" + diff[:5000]
    )


def test_the_configuration_reference_is_fresh_and_describes_every_key() -> None:
    text = config_reference()
    diff = _diff(CONFIG_REFERENCE_FILE, text)
    assert not diff, f"{CONFIG_REFERENCE_FILE} is stale; run scripts/update-golden\n" + diff[:5000]
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) > 250
    undescribed = [row.split("|")[1].strip() for row in rows if row.rstrip().endswith("|  |")]
    assert not undescribed, (
        f"keys without a description (a Field description or docstring): {undescribed}"
    )
    assert any(row.startswith("| `clusters.<name>.workloads.train.lr` |") for row in rows)
    assert any(row.startswith("| `drafters.<name>.source.oci.digest` |") for row in rows)


def test_golden_naming_covers_every_workload_and_drafter(
    edited_config: Callable[..., Path],
) -> None:
    files = golden_files(EXAMPLE)
    names = {p.name for p in files}
    assert {"serve-none.yaml", "serve-v1.yaml", "serve-v2.yaml", "serve-v3.yaml"} <= names
    # Every method has a manifest where its image serves it (every example cluster serves 0.32
    # with Arctic Inference)...
    by_cluster = {c: {p.name for p in files if p.parent.name == c} for c in ("rtx6000", "b200")}
    for cluster in ("rtx6000", "b200"):
        assert {"serve-ngram.yaml", "serve-suffix.yaml", "serve-k25-mla.yaml"} <= by_cluster[
            cluster
        ]
    # ...and none where the plan refuses it: the PCIe host back on vLLM 0.16 has neither.
    anchor = "whatever the drafter.\n      serve: vllm-0.32-kimi\n"
    on_016 = golden_files(edited_config((anchor, anchor.replace("0.32", "0.16"))))
    host = {p.name for p in on_016 if p.parent.name == "rtx6000"}
    assert "serve-ngram.yaml" in host
    assert not {"serve-suffix.yaml", "serve-k25-mla.yaml"} & host
    assert {"datagen.yaml", "extract.yaml", "vocab.yaml", "train.yaml", "bench.yaml"} <= names
