"""Every pod kimideploy renders, for every cluster and workload (the golden files), runs without an
API token and without the hub token: none calls the Kubernetes API and none
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
        # The hub token reaches one pod, as a file: the download into a shared models claim.
        hub = [
            v
            for v in spec.get("volumes", [])
            if (v.get("secret") or {}).get("secretName") == "hf-token"
        ]
        assert not hub or where.endswith("weights.yaml Job"), where


def objects_of(path: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((REPO / "k8s" / "rendered" / path).read_text()) if d]


def test_serve_is_reachable_on_its_port_from_the_namespace_and_monitoring_only() -> None:
    objects = objects_of("rtx6000/serve-v3.yaml")
    assert objects[0]["kind"] == "NetworkPolicy"  # applied before the pods it protects
    policy, deployment = objects[0], next(o for o in objects if o["kind"] == "Deployment")
    selected = policy["spec"]["podSelector"]["matchLabels"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selected.items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 8000, "protocol": "TCP"}]
    assert rule["from"] == [
        {"podSelector": {}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
    ]


def test_batch_pods_take_no_ingress_except_between_the_ranks_of_one_training_job() -> None:
    for path in ("b300/datagen.yaml", "b300/extract.yaml", "b300/bench.yaml", "rtx6000/train.yaml"):
        objects = objects_of(path)
        policy = next(o for o in objects if o["kind"] == "NetworkPolicy")
        job = next(o for o in objects if o["kind"] == "Job")
        assert policy["spec"]["podSelector"]["matchLabels"] == {
            "batch.kubernetes.io/job-name": job["metadata"]["name"]
        }
        assert policy["spec"]["ingress"] == [], path
    objects = objects_of("b300/train.yaml")  # 3 nodes: torchrun's rendezvous and NCCL's sockets
    policy = next(o for o in objects if o["kind"] == "NetworkPolicy")
    job = next(o for o in objects if o["kind"] == "Job")
    own = {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": own}}]}]


def test_serve_outranks_batch_work() -> None:
    classes = {}
    for where, spec in pod_specs():
        classes[where] = spec.get("priorityClassName")
    assert {c for w, c in classes.items() if "/serve-" in w} == {"kimideploy-serve"}
    assert {c for w, c in classes.items() if "/serve-" not in w} == {"kimideploy-batch"}
    shipped = {d["metadata"]["name"]: d["value"]
               for d in yaml.safe_load_all((REPO / "k8s/base/priorityclasses.yaml").read_text())}  # fmt: skip
    assert shipped["kimideploy-serve"] > shipped["kimideploy-batch"]


def test_an_api_key_comes_from_the_secret_and_reaches_exactly_the_callers_of_serve(
    edited_config: Any,
) -> None:
    from kimideploy.config.loading import load_project
    from kimideploy.plan.model import PlanRequest
    from kimideploy.services.rendering import render_workload

    path = edited_config(
        (
            '        resources: {cpu: "48", memory: 384Gi}\n        startup_budget_s: 2700',
            '        resources: {cpu: "48", memory: 384Gi}\n        startup_budget_s: 2700\n'
            "        api_key: {name: kimi-api, key: token}",
        )
    )
    loaded = load_project(path)
    ref = {"secretKeyRef": {"name": "kimi-api", "key": "token"}}

    def env_of(workload: str, drafter: str | None = None) -> tuple[dict[str, Any], Any]:
        objects = render_workload(loaded, PlanRequest(workload, "rtx6000", drafter)).objects
        pod = next(o for o in objects if o["kind"] in ("Deployment", "Job"))["spec"]["template"]
        container = pod["spec"]["containers"][0]
        return {e["name"]: e.get("valueFrom", e.get("value")) for e in container["env"]}, container

    env, container = env_of("serve", "v3")
    assert env["VLLM_API_KEY"] == ref
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"  # /v1 needs the key
    assert env_of("bench")[0]["KIMIDEPLOY_API_KEY"] == ref
    assert env_of("datagen")[0]["KIMIDEPLOY_API_KEY"] == ref
    for workload in ("extract", "vocab", "train"):
        assert "KIMIDEPLOY_API_KEY" not in env_of(workload)[0], workload
    # Without a key, readiness waits for the model list, as before.
    plain = render_workload(
        load_project(REPO / "kimideploy.yaml"), PlanRequest("serve", "rtx6000", "v3")
    )
    deployment = next(o for o in plain.objects if o["kind"] == "Deployment")
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert probe["httpGet"]["path"] == "/v1/models"
