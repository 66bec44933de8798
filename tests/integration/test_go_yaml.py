"""What kimideploy writes reads the same in Go's YAML (kubectl, Argo CD, Flux) as in PyYAML.

PyYAML follows YAML 1.1's patterns; Go's resolver reads more plain scalars as numbers, bools or
null: a run id such as `286e07` is a float to kubectl. Every golden file goes through a
server-side dry run as kubectl parses it, and a property check pushes thousands of generated ids
and label values through the same writer and kubectl."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from kimideploy.render.manifests import to_yaml
from tests.conftest import REPO
from tests.integration.conftest import harness

pytestmark = pytest.mark.integration
GOLDEN = sorted((REPO / "k8s" / "rendered").glob("*/*.yaml"))
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
TRICKY = ["286e07", "1e3", "0x1f", "0o17", "0b101", "1_000", ".5", "-3", "+7", "yes", "on",
          "off", "y", "n", "null", "true", "~", "123456", "00ff00", "7e1234", "1e", "e10"]  # fmt: skip


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_golden_file_is_accepted_as_kubectl_reads_it(
    golden: Path, testcluster: harness.TestCluster, namespace: str
) -> None:
    text = golden.read_text().replace("  namespace: kimi\n", f"  namespace: {namespace}\n")
    testcluster.kubectl("apply", "--dry-run=server", "-f", "-", stdin=text)


def test_generated_ids_and_label_values_stay_strings_in_go(
    testcluster: harness.TestCluster, namespace: str
) -> None:
    rng = random.Random(20261201)
    values = [*TRICKY, *(f"{rng.getrandbits(24):06x}" for _ in range(3000)),
              *(f"{rng.randint(0, 9)}e{rng.randint(0, 99)}" for _ in range(100))]  # fmt: skip
    objects = []
    for start in range(0, len(values), 8):
        chunk = values[start : start + 8]
        objects.append({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"ids-{start}", "namespace": namespace,
                         "labels": {f"kimideploy.io/v{i}": v for i, v in enumerate(chunk)
                                    if LABEL_VALUE.match(v)}},
            "data": {f"v{i}": v for i, v in enumerate(chunk)},
        })  # fmt: skip
    out = testcluster.kubectl(
        "apply", "--dry-run=server", "-o", "json", "-f", "-", stdin=to_yaml(objects)
    )
    items = json.loads(out)["items"]
    got = [
        v for item in items for _, v in sorted(item["data"].items(), key=lambda kv: int(kv[0][1:]))
    ]
    assert got == values
    labels = [item["metadata"]["labels"] for item in items]
    assert all(isinstance(v, str) for label in labels for v in label.values())
