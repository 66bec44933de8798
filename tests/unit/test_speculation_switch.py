"""Speculation switched off and on in a running server (vLLM 0.32 with kimideploy's patch 0002):
which releases start able to switch, which revisions are a switch instead of a reload, the keeper
that keeps the engine where the spec says, and its route. The switch on the engine itself is
tests/pipeline/test_drafter_swap.py (test_rollback_no_spec_switches_speculation_off_...)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kimideploy.config.loading import LoadedProject, load_project
from kimideploy.formats.drafter_swap import (
    DRAFTERS_ROOT_ENV,
    SPECULATION_PATH,
    SPECULATION_SWITCH_ENV,
    SPECULATION_SWITCH_PATCH,
)
from kimideploy.plan.asks import ServeAsk
from kimideploy.plan.model import ClusterAnswers, PlanRequest
from kimideploy.services.release.swap import decide, loaded_drafter
from kimideploy.services.rendering import render_workload
from kimideploy.workloads import drafter_swap
from tests.local_http import answering
from tests.pipeline.conftest import CONFIG as PIPELINE_CONFIG
from tests.unit.test_drafter_swap import deployment, fake_vllm, kind
from tests.unit.test_methods import serving_016


def objects(drafter: str, *, off: bool = False, project: LoadedProject | None = None,
            cluster: str = "cpu") -> list[dict[str, Any]]:  # fmt: skip
    """A rendered serve revision of the pipeline tier's config (or `project`)."""
    request = PlanRequest("serve", cluster, drafter, ask=ServeAsk(speculation_off=off))
    loaded = project or load_project(PIPELINE_CONFIG)
    return render_workload(loaded, request, ClusterAnswers(namespace="t")).objects


def spec_of(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(kind(manifests, "ConfigMap")["data"]["spec.json"])
    return spec


def container_env(values: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in values["env"]}


def without_switch_patch(project: LoadedProject) -> LoadedProject:
    images = dict(project.project.images)
    for name, image in images.items():
        patches = [p for p in image.patches if p != SPECULATION_SWITCH_PATCH]
        images[name] = image.model_copy(update={"patches": patches})
    return replace(project, project=project.project.model_copy(update={"images": images}))


def test_a_swapping_release_on_an_image_with_the_switch_starts_able_to_switch(
    example: LoadedProject,
) -> None:
    switching = deployment(example, PlanRequest("serve", "b300", "v3"))
    assert container_env(switching)[SPECULATION_SWITCH_ENV] == "1"
    # The same image without the patch, and the 0.16 stack, start as before: no switch.
    plain = deployment(without_switch_patch(example), PlanRequest("serve", "b300", "v3"))
    assert SPECULATION_SWITCH_ENV not in container_env(plain)
    old = deployment(serving_016(example), PlanRequest("serve", "rtx6000", "v3"))
    assert SPECULATION_SWITCH_ENV not in container_env(old)
    # A server without a drafter has nothing to switch.
    none = deployment(example, PlanRequest("serve", "b300", "none"))
    assert SPECULATION_SWITCH_ENV not in container_env(none)


def test_switched_off_is_the_same_pods_with_a_spec_that_says_so() -> None:
    on, off = objects("good"), objects("good", off=True)
    assert spec_of(on)["speculation"] is True and spec_of(off)["speculation"] is False
    # Only the spec's hash on the pod template tells the two Deployments apart.
    differing = {k for k in spec_of(on) if spec_of(on)[k] != spec_of(off)[k]}
    assert differing == {"speculation"}
    decision = decide(on, off)
    assert decision.plan is not None, decision.why_not
    assert decision.plan.speculation is False
    assert decision.plan.what == "switch speculation off in the running pods (good stays loaded)"
    assert kind(decision.plan.manifests, "Deployment") == kind(on, "Deployment")
    assert spec_of(decision.plan.manifests)["speculation"] is False


def test_switching_back_on_and_to_another_drafter_keep_the_pods() -> None:
    on = objects("good")
    off = decide(on, objects("good", off=True)).plan
    assert off is not None
    back = decide(off.manifests, on).plan
    assert back is not None and back.speculation and not back.was_speculating
    assert back.what == "switch speculation on in the running pods (good)"
    other = decide(off.manifests, objects("untrained")).plan
    assert other is not None
    assert other.what == (
        "switch speculation on and swap the drafter in the running pods: good -> untrained"
    )
    assert kind(other.manifests, "Deployment") == kind(on, "Deployment")


def test_pods_that_cannot_switch_are_replaced_and_the_reason_said() -> None:
    plain = without_switch_patch(load_project(PIPELINE_CONFIG))
    on, off = objects("good", project=plain), objects("good", off=True, project=plain)
    decision = decide(on, off)
    assert decision.plan is None
    assert decision.why_not == "the serving pods cannot switch speculation off"
    assert loaded_drafter(on) is None


def test_the_loaded_drafter_is_what_the_pods_last_applied_serve() -> None:
    assert loaded_drafter(objects("good")) == "good"
    swapped = decide(objects("good"), objects("untrained")).plan
    assert swapped is not None and loaded_drafter(swapped.manifests) == "untrained"
    assert loaded_drafter(objects("none")) is None
    assert loaded_drafter(None) is None


# --- the keeper ---------------------------------------------------------------------------------


def keeper_for(tmp_path: Path, address: str) -> tuple[drafter_swap.Keeper, Any]:
    spec = tmp_path / "spec.json"

    def wants(name: str, speculation: bool = True) -> None:
        spec.write_text(json.dumps({"drafter": name, "drafter_path": f"/models/drafters/{name}",
                                    "speculation": speculation}))  # fmt: skip

    return drafter_swap.Keeper(f"http://{address}", spec, "good"), wants


def test_the_keeper_switches_speculation_where_the_spec_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv(DRAFTERS_ROOT_ENV, "/models")
    served, calls, speculating = ["default"], [], [True]
    with answering(fake_vllm(served, calls, speculating=speculating)) as address:
        keeper, wants = keeper_for(tmp_path, address)
        wants("good")
        keeper.step()
        assert drafter_swap.read_keeper_state()["state"] == "serving"
        wants("good", speculation=False)
        keeper.step()
        state = drafter_swap.read_keeper_state()
        assert (state["state"], state["speculation"], speculating[0]) == ("off", "off", False)
        assert state["switches"][-1]["to"] == "off"
        assert not any(c.startswith("/update_weights") for c in calls)  # nothing reloaded
        keeper.step()  # staying off asks nothing of the engine
        assert calls.count(f"{SPECULATION_PATH}?enabled=false") == 1
        # Back on with another drafter: switched on first, then swapped.
        wants("untrained")
        keeper.step()
        state = drafter_swap.read_keeper_state()
        assert (state["state"], state["serving"], state["speculation"]) == (
            "serving", "untrained", "on")  # fmt: skip
        assert state["switches"][-1] == {**state["switches"][-1], "to": "on", "reset": True}
        on_at = calls.index(f"{SPECULATION_PATH}?enabled=true")
        assert on_at < calls.index("/update_weights")


def test_a_restarted_engine_is_switched_off_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container that restarts serves with speculation on, whatever was switched before: the
    keeper asks again within KEEPER_RECHECK_S and switches it off."""
    monkeypatch.setenv("HOME", str(tmp_path))
    served, calls, speculating = ["default"], [], [True]
    with answering(fake_vllm(served, calls, speculating=speculating)) as address:
        keeper, wants = keeper_for(tmp_path, address)
        wants("good", speculation=False)
        keeper.step()
        assert speculating[0] is False
        speculating[0] = True  # the engine restarted
        keeper.speculating_at -= drafter_swap.KEEPER_RECHECK_S + 1
        keeper.step()
        assert speculating[0] is False
        assert calls.count(f"{SPECULATION_PATH}?enabled=false") == 2


def test_a_server_without_the_switch_is_refused_not_reloaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    served, calls = ["default"], []
    with answering(fake_vllm(served, calls, speculating=None)) as address:
        keeper, wants = keeper_for(tmp_path, address)
        wants("good", speculation=False)
        keeper.step()
        state = drafter_swap.read_keeper_state()
        assert state["state"] == "refused" and drafter_swap.NO_SWITCH in state["reason"]
        wants("good")  # speculation on is what such a server does anyway
        keeper.step()
        assert drafter_swap.read_keeper_state()["state"] == "serving"


# --- the route ----------------------------------------------------------------------------------


class FakeCore:
    """The engine core client as the route uses it: call_utility_all_async over two engines."""

    def __init__(self, switch: bool = True) -> None:
        self.switch = switch
        self.on = True
        self.calls: list[tuple[str, Any]] = []

    async def call_utility_all_async(self, method: str, *args: Any) -> list[bool]:
        self.calls.append((method, args))
        if not self.switch:
            raise RuntimeError(f"Call to {method} method failed: no such method")
        if args[0] is not None:
            self.on = bool(args[0])
        return [self.on, self.on]


def ask_route(core: FakeCore, method: str, query: str, client: str, token: str | None,
              resets: list[bool]) -> tuple[int, dict[str, Any]]:  # fmt: skip
    async def reset_prefix_cache(running: bool = False) -> bool:
        resets.append(running)
        return True

    engine = SimpleNamespace(engine_core=core, reset_prefix_cache=reset_prefix_cache)
    app = SimpleNamespace(state=SimpleNamespace(engine_client=engine))
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    headers = [(drafter_swap.TOKEN_HEADER.encode(), token.encode())] if token else []
    scope = {"type": "http", "method": method, "path": SPECULATION_PATH, "app": app,
             "query_string": query.encode(), "client": (client, 5000), "headers": headers}  # fmt: skip

    async def teapot(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the switch route must not reach vLLM's app")

    asyncio.run(drafter_swap.DrafterKeeper(teapot)(scope, receive, send))
    return int(sent[0]["status"]), json.loads(sent[1]["body"])


def test_the_switch_route_answers_only_the_pod_and_resets_when_it_switches_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    token = drafter_swap.pod_token()
    core, resets = FakeCore(), []
    assert ask_route(core, "POST", "enabled=false", "10.4.0.7", token, resets)[0] == 403
    assert ask_route(core, "POST", "enabled=false", "127.0.0.1", None, resets)[0] == 403
    assert core.calls == []
    status, body = ask_route(core, "POST", "enabled=maybe", "127.0.0.1", token, resets)
    assert status == 400 and "enabled=true|false" in body["error"]
    assert ask_route(core, "GET", "", "127.0.0.1", token, resets)[1] == {
        "speculation": True, "changed": False, "reset": None}  # fmt: skip
    status, body = ask_route(core, "POST", "enabled=false", "127.0.0.1", token, resets)
    assert (status, body) == (200, {"speculation": False, "changed": True, "reset": None})
    assert resets == []  # switching off needs no reset
    status, body = ask_route(core, "POST", "enabled=true", "::1", token, resets)
    assert (status, body) == (200, {"speculation": True, "changed": True, "reset": True})
    assert resets == [True]  # running requests re-prefilled: the drafter's KV is rebuilt
    # Asking for what already holds changes nothing and resets nothing.
    assert ask_route(core, "POST", "enabled=true", "::1", token, resets)[1]["changed"] is False
    assert resets == [True]


def test_the_switch_route_over_a_vllm_without_the_patch_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    token = drafter_swap.pod_token()
    status, body = ask_route(FakeCore(switch=False), "POST", "enabled=false", "127.0.0.1",
                             token, [])  # fmt: skip
    assert (status, body) == (501, {"error": drafter_swap.NO_SWITCH})
