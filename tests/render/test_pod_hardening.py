"""Every pod kimideploy renders, for every cluster and workload (the golden files), runs without an
API token and without the hub token (issue: safety): none calls the Kubernetes API and none
downloads from the hub."""

from __future__ import annotations

from typing import Any

import yaml

from tests.conftest import REPO


def pod_specs() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted((REPO / "k8s" / "rendered").glob("*/*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            template = ((doc or {}).get("spec") or {}).get("template")
            if template:
                found.append((f"{path.parent.name}/{path.name} {doc['kind']}", template["spec"]))
    return found


def test_no_pod_mounts_a_service_account_token_or_gets_the_hub_token() -> None:
    specs = pod_specs()
    assert len(specs) >= 27  # every golden file has a workload pod
    for where, spec in specs:
        assert spec.get("automountServiceAccountToken") is False, where
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            names = {e["name"] for e in container.get("env", [])}
            assert "HF_TOKEN" not in names, (where, container["name"])
