"""The YAML writer quotes what Go's resolver would not read as a string, and PyYAML still reads
back every value unchanged (the Go side is tests/integration/test_go_yaml.py, with kubectl)."""

from __future__ import annotations

import random

import pytest
import yaml

from kimideploy.render.manifests import needs_quotes_for_go, to_yaml


@pytest.mark.parametrize(
    ("value", "quoted"),
    [("286e07", True), ("1e3", True), ("0o17", True), ("0x1F", True), ("1_000", True),
     ("yes", True), ("Off", True), ("~", True), ("", True), ("-3", True),
     ("ac77f9", False), ("e10", False), ("12a345", False), ("v1", False), ("1e", False)],
)  # fmt: skip
def test_go_ambiguous_scalars_are_quoted(value: str, quoted: bool) -> None:
    assert needs_quotes_for_go(value) is quoted
    line = to_yaml([{"k": value}]).splitlines()[1]
    assert (line == f"k: '{value}'") is quoted or (not value and line == "k: ''")


def test_every_generated_value_reads_back_unchanged_in_pyyaml() -> None:
    rng = random.Random(7)
    alphabet = "0123456789abcdefeE.+-_xob"
    values = [f"{rng.getrandbits(24):06x}" for _ in range(2000)]
    values += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))) for _ in range(3000)]
    docs = [{"metadata": {"labels": {"v": v}}, "data": {"v": v}} for v in values]
    back = list(yaml.safe_load_all(to_yaml(docs)))
    assert [d["data"]["v"] for d in back] == values
    assert [d["metadata"]["labels"]["v"] for d in back] == values
