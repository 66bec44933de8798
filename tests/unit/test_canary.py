"""The canary's objects, its refusals and its verdict (services/release/canary.py,
plan/gateway.py). The objects are proven on the control plane with the real CRDs in
tests/integration/test_canary.py; here: what selects what, and how live counters are judged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.clusters import CanaryJudgement
from kimideploy.config.loading import LoadedProject, load_project_text
from kimideploy.errors import UsageError
from kimideploy.plan.asks import ServeAsk
from kimideploy.plan.gateway import route_weights, with_canary_share
from kimideploy.plan.model import PlanRequest
from kimideploy.services.release.canary import PoolWindow, pool_window, verdict
from kimideploy.services.rendering import render_workload
from tests.conftest import EXAMPLE

GATEWAY = (
    "    gateway:\n"
    "      name: inference-gateway\n"
    "      namespace: gateways\n"
    "      endpoint_picker: {image: registry.example/lwepp:v1.6.2}\n"
)
RELEASE = "kimi-k25-serve"


def with_gateway(*clusters: str) -> LoadedProject:
    text = EXAMPLE.read_text()
    for cluster in clusters:
        head = f"\n  {cluster}:\n"
        assert text.count(head) == 1
        text = text.replace(head, head + GATEWAY)
    return load_project_text(text, Path("kimideploy.yaml"))


def objects(loaded: LoadedProject, cluster: str, **asked: Any) -> list[dict[str, Any]]:
    drafter = asked.pop("drafter", "v3")
    request = PlanRequest("serve", cluster, drafter, ask=ServeAsk(**asked))
    return render_workload(loaded, request).objects


def named(found: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [one] = [o for o in found if o["kind"] == kind and o["metadata"]["name"] == name]
    return one


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def test_each_pool_selects_its_own_pods_and_the_release_never_selects_the_canarys() -> None:
    found = objects(with_gateway("b300"), "b300", canary_percent=10)
    stable_pool = named(found, "InferencePool", RELEASE)["spec"]["selector"]["matchLabels"]
    canary_pool = named(found, "InferencePool", f"{RELEASE}-canary")["spec"]["selector"][
        "matchLabels"
    ]
    canary = named(found, "Deployment", f"{RELEASE}-canary")
    pickers = [pod_labels(named(found, "Deployment", f"{n}-epp")) for n in
               (RELEASE, f"{RELEASE}-canary")]  # fmt: skip
    assert canary["spec"]["replicas"] == 1
    assert selects(canary_pool, pod_labels(canary)) and not selects(stable_pool, pod_labels(canary))
    # What the serving revision selects with (its Service and Deployment: instance + component)
    # takes neither the canary's pod nor a picker's.
    release_selector = {
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": "serve",
    }
    assert release_selector == stable_pool
    for labels in (pod_labels(canary), *pickers):
        assert not selects(release_selector, labels)
    assert not any(selects(canary_pool, labels) for labels in pickers)
    route = named(found, "HTTPRoute", RELEASE)
    assert route_weights(route) == {RELEASE: 90, f"{RELEASE}-canary": 10}
    assert route["spec"]["parentRefs"] == [{"name": "inference-gateway", "namespace": "gateways"}]
    assert route_weights(with_canary_share(route, RELEASE, 100)) == {
        RELEASE: 0, f"{RELEASE}-canary": 100}  # fmt: skip
    # Each pool names its own picker, and each picker serves its pool only.
    for pool in (RELEASE, f"{RELEASE}-canary"):
        assert named(found, "InferencePool", pool)["spec"]["endpointPickerRef"]["name"] == (
            f"{pool}-epp"
        )
        args = named(found, "Deployment", f"{pool}-epp")["spec"]["template"]["spec"]["containers"][
            0
        ]["args"]
        assert args[args.index("--pool-name") + 1] == pool


def test_serving_behind_a_gateway_routes_everything_to_the_release() -> None:
    found = objects(with_gateway("b300"), "b300")
    assert route_weights(named(found, "HTTPRoute", RELEASE)) == {RELEASE: 100}
    assert not [o for o in found if o["metadata"]["name"].endswith("-canary")]
    # The Gateway's data plane, in its own namespace, may reach the serve pods.
    policy = named(found, "NetworkPolicy", RELEASE)
    peers = policy["spec"]["ingress"][0]["from"]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateways"}}} in (
        peers
    )


def test_a_cluster_that_cannot_hold_a_second_copy_points_to_the_interleaved_ab() -> None:
    with pytest.raises(UsageError) as info:
        objects(with_gateway("rtx6000"), "rtx6000", canary_percent=10)
    assert "cannot hold a canary" in info.value.message
    assert "8 GPUs hold 1 serving copy of 8" in info.value.message
    assert "run bench --drafters A,B --rounds" in (info.value.hint or "")


def test_a_canary_needs_a_gateway_and_a_drafter() -> None:
    with pytest.raises(UsageError) as info:
        objects(with_gateway("b300"), "b200", canary_percent=10)
    assert "has no gateway" in info.value.message
    assert "clusters.b200.gateway" in (info.value.hint or "")
    with pytest.raises(UsageError) as info:
        objects(with_gateway("b300"), "b300", canary_percent=10, drafter="none")
    assert "--canary needs --drafter" in info.value.message


def metrics(*, drafts: float, accepted: float, k: int = 3, tpot: tuple[float, float]) -> str:
    """A vLLM 0.32 /metrics text with the counters and the histogram the judge reads."""
    seconds, requests = tpot
    model = 'engine="0",model_name="kimi-k2.5"'
    return "\n".join([
        "# TYPE vllm:spec_decode_num_drafts_total counter",
        f"vllm:spec_decode_num_drafts_total{{{model}}} {drafts}",
        "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
        f"vllm:spec_decode_num_draft_tokens_total{{{model}}} {drafts * k}",
        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
        f"vllm:spec_decode_num_accepted_tokens_total{{{model}}} {accepted}",
        "# TYPE vllm:request_time_per_output_token_seconds histogram",
        f'vllm:request_time_per_output_token_seconds_bucket{{{model},le="+Inf"}} {requests}',
        f"vllm:request_time_per_output_token_seconds_sum{{{model}}} {seconds}",
        f"vllm:request_time_per_output_token_seconds_count{{{model}}} {requests}",
        "",
    ])  # fmt: skip


def test_a_pools_window_is_the_difference_of_two_scrapes_and_a_restart_counts_from_zero() -> None:
    before = {
        "a": metrics(drafts=100, accepted=150, tpot=(1.0, 50)),
        "b": metrics(drafts=500, accepted=900, tpot=(4.0, 200)),
    }
    after = {
        "a": metrics(drafts=300, accepted=450, tpot=(3.0, 150)),  # +200 drafts, +100 requests
        "b": metrics(drafts=40, accepted=60, tpot=(0.5, 20)),  # restarted: all of it is new
        "c": metrics(drafts=10, accepted=30, tpot=(0.2, 10)),  # new pod: all of it
    }
    window = pool_window(before, after)
    assert window.pods == 3
    assert window.requests == pytest.approx(130)
    assert window.seconds_per_token == pytest.approx((2.0 + 0.5 + 0.2) / 130)
    assert window.acceptance is not None
    assert window.acceptance.drafts == pytest.approx(250)
    assert window.acceptance.accepted == pytest.approx(300 + 60 + 30)


def pool(requests: float, pods: int, ms: float, rate: float | None) -> PoolWindow:
    from kimideploy.formats.vllm_metrics import Acceptance

    counted = None if rate is None else Acceptance(100, 300, 300 * rate, ())
    return PoolWindow(pods, requests, ms / 1000, counted)


SETTINGS = CanaryJudgement(window_s=60, windows=5, min_requests=50)


@pytest.mark.parametrize(
    ("stable", "canary", "break_even", "promote", "compared", "said"),
    [
        # Too little traffic on one side: refused, whatever else is seen.
        (pool(900, 9, 20, None), pool(10, 1, 10, 0.9), 0.3, False, False, "too few"),
        # Below break-even: refused before speed is looked at.
        (pool(900, 9, 20, None), pool(100, 1, 10, 0.2), 0.3, False, False, "below break-even"),
        # Comparable loads (100 vs 100 per pod): speed decides.
        (pool(900, 9, 20, None), pool(100, 1, 15, 0.6), 0.3, True, True, "speedup 1.333"),
        (pool(900, 9, 20, None), pool(100, 1, 19.5, 0.6), 0.3, False, True, "speedup 1.026 <"),
        # The canary's pod carries a third of the stable pods' load: its speed would flatter it,
        # so only acceptance is judged, and the verdict says so.
        (pool(900, 3, 20, None), pool(100, 1, 5, 0.6), 0.3, True, False, "speeds not compared"),
        # ...and a canary without acceptance to judge cannot pass on speed it cannot compare.
        (pool(900, 3, 20, None), pool(100, 1, 5, None), None, False, False, "differ too much"),
        # No counters from a speculative canary: refused.
        (pool(900, 9, 20, None), pool(100, 1, 15, None), 0.3, False, False, "no speculative"),
    ],
)
def test_the_verdict_promotes_only_what_live_traffic_shows_pays(
    stable: PoolWindow,
    canary: PoolWindow,
    break_even: float | None,
    promote: bool,
    compared: bool,
    said: str,
) -> None:
    judged = verdict(stable, canary, break_even=break_even, min_speedup=1.05, settings=SETTINGS)
    assert (judged.promote, judged.speed_compared) == (promote, compared), judged.reason
    assert said in judged.reason
    assert judged.weight == (100 if promote else 0)
    assert judged.details()["canary_weight"] == judged.weight


def test_the_releases_own_deployment_comes_first_among_a_gateway_revisions() -> None:
    """The gate, watch and the swap read a revision's first Deployment as the release's: the
    pickers' and the canary's sort after it, alone and merged as a canary revision is."""
    from kimideploy.render.manifests import sort_for_apply

    loaded = with_gateway("b300")
    serving = objects(loaded, "b300", drafter="v2")
    canary = objects(loaded, "b300", canary_percent=10)
    for revision in (serving, sort_for_apply([*serving, *canary])):
        deployments = [o["metadata"]["name"] for o in revision if o["kind"] == "Deployment"]
        assert len(deployments) >= 2 and deployments[0] == RELEASE, deployments


def test_the_shipped_picker_role_only_reads_what_the_picker_watches() -> None:
    """k8s/base/rbac.yaml's kimideploy-endpoint-picker is the role every release's RoleBinding
    names, with exactly the reads formats/endpoint_picker.py documents."""
    import yaml

    from kimideploy.formats.endpoint_picker import PICKER_CLUSTER_ROLE, PICKER_RULES
    from tests.conftest import REPO

    shipped = list(yaml.safe_load_all((REPO / "k8s" / "base" / "rbac.yaml").read_text()))
    [role] = [d for d in shipped if d["metadata"]["name"] == PICKER_CLUSTER_ROLE]
    assert role["kind"] == "ClusterRole" and role["rules"] == PICKER_RULES
    found = objects(with_gateway("b300"), "b300")
    binding = named(found, "RoleBinding", f"{RELEASE}-epp")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": PICKER_CLUSTER_ROLE}  # fmt: skip
    assert not [o for o in found if o["kind"] in ("Role", "ClusterRole", "ClusterRoleBinding")]
