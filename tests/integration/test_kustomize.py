"""`render --kustomize`: what the real kubectl's Kustomize builds per cluster is what `up` and `run`
apply there, and the tree is written without losing anyone's files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kimideploy.cli.main import main
from kimideploy.config.loading import load_project
from kimideploy.plan.model import PlanRequest
from kimideploy.services.rendering import render_workload
from tests.conftest import REPO
from tests.integration.conftest import harness
from tests.integration.test_gate import (
    BENCH_PODS,
    QUICK_BENCH,
    baseline_and_v3,
    bench_log,
    by_drafter,
)

pytestmark = pytest.mark.integration
CLUSTERS = ("rtx6000", "b200", "b300")


@pytest.fixture
def kd(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """`kimideploy render` contacts no cluster: no --context, unlike the cluster commands'."""

    def run(*args: str) -> tuple[int, str, str]:
        code = main(["--config", str(REPO / "kimideploy.yaml"), *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def keyed(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects}


@pytest.mark.parametrize(
    ("workload", "drafter"), [("serve", "v3"), ("serve", "none"), ("train", None), ("bench", "v3")]
)
def test_each_overlay_builds_the_objects_up_applies_on_that_cluster(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    tmp_path: Path,
    workload: str,
    drafter: str | None,
) -> None:
    tree = tmp_path / "gitops"
    chosen = ("--drafter", drafter) if drafter else ()
    code, _, err = kd("render", workload, *chosen, "--kustomize", str(tree))
    assert code == 0, err
    assert sorted(p.name for p in (tree / "overlays").iterdir()) == sorted(CLUSTERS)
    loaded = load_project(REPO / "kimideploy.yaml")
    for cluster in CLUSTERS:
        built = list(
            yaml.safe_load_all(testcluster.kubectl("kustomize", str(tree / "overlays" / cluster)))
        )
        applied = render_workload(loaded, PlanRequest(workload, cluster, drafter)).objects
        assert keyed(built) == keyed(applied), cluster
    # The base is the default cluster's render of what every cluster has; overlays patch it.
    base = yaml.safe_load((tree / "base" / "kustomization.yaml").read_text())
    assert base["resources"] and all((tree / "base" / r).exists() for r in base["resources"])
    if workload == "serve":
        b300 = yaml.safe_load((tree / "overlays" / "b300" / "kustomization.yaml").read_text())
        assert b300["namespace"] == "kimi" and b300["resources"][0] == "../../base"
        [deployment] = [p for p in b300["patches"] if p["target"]["kind"] == "Deployment"]
        operations = yaml.safe_load((tree / "overlays" / "b300" / deployment["path"]).read_text())
        paths = {op["path"] for op in operations}
        assert "/metadata/labels/kimideploy.io~1cluster" in paths  # a slash, JSON-Pointer escaped
        assert not any(p.startswith("/metadata/namespace") for p in paths)


def test_an_overlay_is_accepted_by_the_api_server_as_kubectl_builds_it(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    tree = tmp_path / "gitops"
    assert kd("render", "serve", "--drafter", "v3", "--kustomize", str(tree))[0] == 0
    overlay = tree / "overlays" / "rtx6000" / "kustomization.yaml"
    overlay.write_text(
        overlay.read_text().replace("namespace: kimi\n", f"namespace: {namespace}\n")
    )
    out = testcluster.kubectl("apply", "--dry-run=server", "-k", str(overlay.parent))
    assert "deployment.apps/kimi-k25-serve created (server dry run)" in out


def test_a_folder_of_someone_elses_files_is_refused_and_a_tree_is_replaced_whole(
    kd: Callable[..., tuple[int, str, str]], tmp_path: Path
) -> None:
    mine = tmp_path / "repo"
    mine.mkdir()
    (mine / "README.md").write_text("my notes\n")
    code, _, err = kd("render", "serve", "--kustomize", str(mine))
    assert code == 2 and "not written by `render --kustomize`; nothing was written" in err
    assert sorted(p.name for p in mine.iterdir()) == ["README.md"]

    tree = tmp_path / "gitops"
    assert kd("render", "serve", "--drafter", "v3", "--kustomize", str(tree))[0] == 0
    code, _, err = kd("render", "serve", "--drafter", "v3", "--cluster", "b300", "--overlay",
                      "b300", "--kustomize", str(tree))  # fmt: skip
    assert code == 0, err
    assert [p.name for p in (tree / "overlays").iterdir()] == ["b300"]  # no stale overlay left
    assert "base: b300" in (tree / ".kimideploy-kustomize").read_text()
    code, _, err = kd("render", "serve", "--overlay", "b9", "--kustomize", str(tree))
    assert code == 2 and "--overlay b9: no such cluster" in err
    code, _, err = kd("render", "serve", "--overlay", "b300")
    assert code == 2 and "--overlay only applies with --kustomize" in err


def sync(testcluster: harness.TestCluster, tree: Path, namespace: str) -> None:
    """What Argo CD does with the overlay: build it, apply it as its own field manager, wait."""
    overlay = tree / "overlays" / "rtx6000"
    text = (overlay / "kustomization.yaml").read_text()
    (overlay / "kustomization.yaml").write_text(
        text.replace("namespace: kimi\n", f"namespace: {namespace}\n")
    )
    testcluster.kubectl(
        "apply", "--server-side", "--field-manager", "argocd-controller", "-k", str(overlay)
    )
    testcluster.kubectl(
        "-n", namespace, "rollout", "status", "deployment/kimi-k25-serve", "--timeout=120s"
    )


def test_the_gate_judges_a_release_gitops_applied_and_changes_nothing(
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(testcluster.kubeconfig))

    def kimideploy(*args: str) -> tuple[int, str, str]:
        code = main(["--config", str(REPO / "kimideploy.yaml"), *args])
        out, err = capsys.readouterr()
        return code, out, err

    def gate(drafter: str, *extra: str) -> tuple[int, str, str]:
        return kimideploy("gate", "serve", "--drafter", drafter, "--at-concurrency", "1,8",
                          "--set", QUICK_BENCH, "--poll", "0.3", "--context", "kimideploy-test",
                          "--namespace", namespace, *extra)  # fmt: skip

    files = baseline_and_v3(tmp_path, {1: 40.0, 8: 390.0}, 0.15)
    code, _, err = gate("v3")
    assert code == 2 and "kimi-k25-serve is not deployed in namespace" in err
    with harness.PodHooks(testcluster, namespace, BENCH_PODS, by_drafter(files)):
        for drafter in ("none", "v3"):
            tree = tmp_path / drafter
            assert (
                kimideploy("render", "serve", "--drafter", drafter, "--kustomize", str(tree))[0]
                == 0
            )
            sync(testcluster, tree, namespace)
            if drafter == "none":
                code, _, err = gate("v3")
                assert code == 2 and "is not this render" in err  # none serves, not v3
                code, out, err = gate("none")
                assert code == 0 and out.startswith("baseline stored: bench run "), err
        code, out, err = gate("v3", "--min-speedup", "1.1", "-o", "json")
    document = json.loads(out)
    assert code == 4 and document["status"] == "gate-would-roll-back", err
    assert document["verdict"]["decision"] == "rollback" and document["revision"] is None
    assert "below 1.10x at chat c=1 0.67x" in document["reason"]
    # Nothing was changed: v3 still serves, and kimideploy wrote no release record.
    deployment = json.loads(
        testcluster.kubectl("-n", namespace, "get", "deployment", "kimi-k25-serve", "-o", "json")
    )
    assert deployment["metadata"]["labels"]["kimideploy.io/drafter"] == "v3"
    secrets = testcluster.kubectl(
        "-n", namespace, "get", "secrets", "-l", "kimideploy.io/release-record", "-o", "name"
    )
    assert secrets.strip() == ""

    files["v3"] = bench_log(tmp_path / "v3-fast.log", "v3", {1: 90.0, 8: 520.0}, 0.7)
    with harness.PodHooks(testcluster, namespace, BENCH_PODS, by_drafter(files)):
        code, out, err = gate("v3", "--min-speedup", "1.1")
    assert code == 0 and out.startswith("gate: kept"), err
