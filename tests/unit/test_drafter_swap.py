"""The drafter swap's own logic: which files may replace a running drafter, which releases start
able to swap, and the guard that keeps vLLM's development routes to the pod itself. The swap on
the engine is tests/pipeline/test_drafter_swap.py."""

from __future__ import annotations

import asyncio
import json
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.loading import LoadedProject, load_project
from kimideploy.formats.drafter_swap import (
    DEV_ROUTES_GUARD,
    DRAFTER_FILES_BACKEND,
    DRAFTERS_ROOT_ENV,
    KEEPER_PATH,
    SPECULATION_PATH,
    SWAP_REFUSED,
    hold_drafter,
    swap_refusals,
)
from kimideploy.plan.asks import ServeAsk, SyntheticAcceptance
from kimideploy.plan.model import ClusterAnswers, PlanRequest
from kimideploy.plan.resolve import resolve
from kimideploy.services.release.swap import decide
from kimideploy.services.rendering import render_workload
from kimideploy.workloads import drafter_swap
from tests.local_http import answering
from tests.pipeline.conftest import CONFIG as PIPELINE_CONFIG
from tests.unit.test_drafter_check import write_safetensors
from tests.unit.test_methods import serving_016

CONFIG: dict[str, Any] = {
    "architectures": ["Eagle3DraftModel"],
    "draft_vocab_size": 512,
    "eagle_aux_hidden_state_layer_ids": [2, 3, 4],
    "embed_requires_grad": False,
    "transformers_version": "4.57.0",
    "speculators_config": {"verifier": {"name_or_path": "/models/hub/x/target"}},
    "transformer_layer_config": {"hidden_size": 128, "num_hidden_layers": 1},
}
TENSORS = {"fc.weight": ("BF16", [128, 384]), "lm_head.weight": ("BF16", [512, 128]),
           "d2t": ("I64", [512])}  # fmt: skip


def drafter(root: Path, config: dict[str, Any] | None = None,
            tensors: dict[str, tuple[str, list[int]]] | None = None) -> Path:  # fmt: skip
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config or CONFIG))
    write_safetensors(root / "model.safetensors", tensors or TENSORS)
    return root


def refusals(running: Path, candidate: Path) -> list[str]:
    return swap_refusals(hold_drafter(running), hold_drafter(candidate))


def edited(**changes: Any) -> dict[str, Any]:
    config = json.loads(json.dumps(CONFIG))
    config.update(changes)
    return config


def test_same_shape_drafters_swap_whatever_their_paths_and_versions(tmp_path: Path) -> None:
    running = drafter(tmp_path / "a")
    other = edited(transformers_version="4.58.1", _name_or_path="/elsewhere")
    other["speculators_config"] = {"verifier": {"name_or_path": "/other/copy/of/target"}}
    assert refusals(running, drafter(tmp_path / "b", other)) == []


@pytest.mark.parametrize(
    ("config", "tensors", "named"),
    [
        (edited(eagle_aux_hidden_state_layer_ids=[3, 4, 5]), None,
         "config.json eagle_aux_hidden_state_layer_ids: running [2, 3, 4], candidate [3, 4, 5]"),
        (edited(draft_vocab_size=1024), None, "config.json draft_vocab_size"),
        (edited(embed_requires_grad=True), None, "config.json embed_requires_grad"),
        (edited(transformer_layer_config={"hidden_size": 128, "num_hidden_layers": 2}), None,
         "config.json transformer_layer_config.num_hidden_layers"),
        (None, {**TENSORS, "embed_tokens.weight": ("BF16", [1024, 128])},
         "tensor embed_tokens.weight: only the candidate has it"),
        (None, {k: v for k, v in TENSORS.items() if k != "d2t"},
         "tensor d2t: only the running drafter has it"),
        (None, {**TENSORS, "lm_head.weight": ("BF16", [1024, 128])},
         "tensor lm_head.weight: running BF16 [512, 128], candidate BF16 [1024, 128]"),
    ],
)  # fmt: skip
def test_a_drafter_vllm_would_build_differently_is_refused_with_the_reason(
    tmp_path: Path, config: dict[str, Any] | None, tensors: Any, named: str
) -> None:
    running = drafter(tmp_path / "a")
    reasons = refusals(running, drafter(tmp_path / "b", config, tensors))
    assert any(reason.startswith(named) for reason in reasons), reasons


def test_unreadable_candidates_are_refused_not_raised(tmp_path: Path) -> None:
    running = drafter(tmp_path / "a")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert refusals(running, empty)[0] == (
        f"{empty}/config.json: cannot be opened (No such file or directory)"
    )
    broken = drafter(tmp_path / "broken")
    (broken / "model.safetensors").write_bytes(b"\x10\x00")
    assert any("model.safetensors" in r for r in refusals(running, broken))


def deployment(example: LoadedProject, request: PlanRequest) -> dict[str, Any]:
    plan = resolve(example, request)
    return next(o.values for o in plan.objects if o.template == "deployment-serve")


def swap_parts(values: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    args, env = values["args"], {e["name"]: e.get("value") for e in values["env"]}
    backend = (
        args[args.index("--weight-transfer-config") + 1]
        if "--weight-transfer-config" in args
        else None
    )
    guard = args[args.index("--middleware") + 1] if "--middleware" in args else None
    return backend, guard, env.get("VLLM_SERVER_DEV_MODE")


def test_an_eagle_release_on_vllm_032_starts_able_to_swap(example: LoadedProject) -> None:
    backend, guard, dev_mode = swap_parts(deployment(example, PlanRequest("serve", "b300", "v3")))
    assert backend is not None and json.loads(backend) == {"backend": DRAFTER_FILES_BACKEND}
    # The guard always comes with development mode: never one without the other.
    assert (guard, dev_mode) == (DEV_ROUTES_GUARD, "1")


@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_releases_without_drafter_weights_do_not_open_development_mode(
    example: LoadedProject, drafter: str
) -> None:
    assert swap_parts(deployment(example, PlanRequest("serve", "b300", drafter))) == (
        None,
        None,
        None,
    )


def test_the_016_stack_and_a_switched_off_swap_start_as_before(example: LoadedProject) -> None:
    old = deployment(serving_016(example), PlanRequest("serve", "rtx6000", "v3"))
    assert swap_parts(old) == (None, None, None)
    clusters = dict(example.project.clusters)
    b300 = clusters["b300"]
    serve = b300.workloads.serve.model_copy(update={"drafter_swap": False})
    clusters["b300"] = b300.model_copy(
        update={"workloads": b300.workloads.model_copy(update={"serve": serve})}
    )
    off = replace(example, project=example.project.model_copy(update={"clusters": clusters}))
    assert swap_parts(deployment(off, PlanRequest("serve", "b300", "v3"))) == (None, None, None)


def test_calibration_serves_keep_their_own_development_mode_without_a_swap(
    example: LoadedProject,
) -> None:
    request = PlanRequest(
        "serve", "b300", "v3", ask=ServeAsk(synthetic=SyntheticAcceptance(3, (2.0,)))
    )
    backend, guard, dev_mode = swap_parts(deployment(example, request))
    assert (backend, guard, dev_mode) == (None, None, "1")


GUARDED = frozenset({"/start_draft_weight_update", "/collective_rpc"})


async def reached_app(scope: Any, receive: Any, send: Any) -> None:
    """The app behind the guard: 200 to whatever reaches it."""
    await send({"type": "http.response.start", "status": 200, "headers": []})


def call(guard: Any, path: str, client: str, token: str | None,
         root_path: str = "") -> int:  # fmt: skip
    """The status a request gets through the guard (200 when it reached the app)."""
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    headers = [(drafter_swap.TOKEN_HEADER.encode(), token.encode())] if token is not None else []
    scope = {"type": "http", "method": "GET", "path": path, "root_path": root_path,
             "client": (client, 50000), "headers": headers}  # fmt: skip
    asyncio.run(guard(scope, receive, send))
    return int(sent[0]["status"])


def test_development_routes_answer_only_the_pod_itself_with_its_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    guard = drafter_swap.DevRoutesGuard(reached_app, guarded=GUARDED)
    token = drafter_swap.pod_token()
    assert guard.token == token and len(token) == 64
    assert stat.S_IMODE(drafter_swap.token_path().stat().st_mode) == 0o600
    assert call(guard, "/start_draft_weight_update", "127.0.0.1", token) == 200
    assert call(guard, "/collective_rpc", "::1", token) == 200
    assert call(guard, "/start_draft_weight_update", "10.4.0.7", token) == 403
    assert call(guard, "/start_draft_weight_update", "127.0.0.1", None) == 403
    assert call(guard, "/start_draft_weight_update", "127.0.0.1", "0" * 64) == 403
    assert call(guard, "/v1/completions", "10.4.0.7", None) == 200
    # The same route spelled another way is the same route.
    assert call(guard, "/start_draft_weight_update/", "10.4.0.7", token) == 403
    assert call(guard, "//collective_rpc", "10.4.0.7", token) == 403
    assert call(guard, "/v/collective_rpc", "10.4.0.7", token, root_path="/v") == 403
    # A second API-server process of the same pod reads the same token.
    assert drafter_swap.DevRoutesGuard(reached_app, guarded=GUARDED).token == token


def test_a_swap_closes_the_session_an_interrupted_swap_left_open(tmp_path: Path) -> None:
    """vLLM refuses a start while an earlier update is open (a client killed between start and
    load); the swap finishes that one and starts again, and says the version vLLM then reports."""
    calls: list[str] = []
    open_session = [True]

    def respond(handler: Any) -> None:
        path = handler.path
        length = int(handler.headers.get("Content-Length") or 0)
        handler.rfile.read(length)
        calls.append(path)
        status, body = 200, {}
        if handler.headers.get(drafter_swap.TOKEN_HEADER) != "t" * 64:
            status, body = 403, {"error": "no token"}
        elif path == "/start_draft_weight_update" and open_session[0]:
            status, body = 500, {"error": "start_weight_update called while a weight update is "
                                          "already active. Call finish_weight_update first."}  # fmt: skip
        elif path == "/finish_weight_update":
            open_session[0] = False
        elif path.startswith("/reset_prefix_cache"):
            body = {"success": True}
        elif path == "/weight_info":
            body = {"weight_version": "v2"}
        raw = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Length", str(len(raw)))
        handler.end_headers()
        handler.wfile.write(raw)

    with answering(respond) as address:
        times = drafter_swap.swap("/models/drafters/v2", version="v2", url=f"http://{address}",
                                  token="t" * 64)  # fmt: skip
    assert times.weight_version == "v2"
    assert calls == ["/start_draft_weight_update", "/finish_weight_update",
                     "/start_draft_weight_update", "/update_weights", "/finish_weight_update",
                     "/reset_prefix_cache?reset_running_requests=true", "/weight_info"]  # fmt: skip


def test_a_refused_load_is_the_servers_answer(tmp_path: Path) -> None:
    def respond(handler: Any) -> None:
        handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        refused = handler.path == "/update_weights"
        raw = json.dumps(
            {"error": "cannot replace the running drafter"} if refused else {}
        ).encode()
        handler.send_response(500 if refused else 200)
        handler.send_header("Content-Length", str(len(raw)))
        handler.end_headers()
        handler.wfile.write(raw)

    with answering(respond) as address, pytest.raises(drafter_swap.SwapError) as info:
        drafter_swap.swap("/models/drafters/v9", version="v9", url=f"http://{address}", token="x")
    assert str(info.value).startswith("/update_weights: HTTP 500: ")
    assert "cannot replace the running drafter" in str(info.value)


# --- which revisions swap, and the keeper ----------------------------------------------------


def pipeline_objects(drafter: str, *overrides: str) -> list[dict[str, Any]]:
    request = PlanRequest("serve", "cpu", drafter, overrides=overrides)
    answers = ClusterAnswers(namespace="t")
    return render_workload(load_project(PIPELINE_CONFIG), request, answers).objects


def kind(objects: list[dict[str, Any]], wanted: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == wanted)


def test_a_revision_that_changes_only_the_drafter_is_a_swap_that_keeps_the_deployment() -> None:
    good, untrained = pipeline_objects("good"), pipeline_objects("untrained")
    decision = decide(good, untrained)
    assert decision.plan is not None, decision.why_not
    assert (decision.plan.serving, decision.plan.wanted) == ("good", "untrained")
    # The pods keep the template they started with; the spec they mount names the new drafter.
    assert kind(decision.plan.manifests, "Deployment") == kind(good, "Deployment")
    spec = json.loads(kind(decision.plan.manifests, "ConfigMap")["data"]["spec.json"])
    assert spec["drafter"] == "untrained"
    assert [o["kind"] for o in decision.plan.manifests] == [o["kind"] for o in untrained]
    # Rolling back is the same decision the other way round, from what the swap applied.
    back = decide(decision.plan.manifests, good)
    assert back.plan is not None and back.plan.wanted == "good"
    assert kind(back.plan.manifests, "Deployment") == kind(good, "Deployment")


@pytest.mark.parametrize(
    ("serving", "wanted", "allowed", "why"),
    [
        # Recorded in SGLang's convention: vLLM would capture other layers.
        ("good", ("shifted",), True, "more than the drafter changes (spec.layers"),
        ("good", ("untrained", "serve.max_num_seqs=3"), True,
         "more than the drafter changes (Deployment.spec.template.spec.containers[0].args"),
        ("good", ("none",), True, "the new revision does not serve a swappable drafter"),
        ("good", ("untrained",), False, "--no-swap"),
        ("good", ("good",), True, ""),  # nothing to swap: an ordinary re-apply
        ("none", ("good",), True, ""),  # the running server was not started able to swap
    ],
)  # fmt: skip
def test_a_revision_that_changes_more_is_rolled_out_and_says_why(
    serving: str, wanted: tuple[str, ...], allowed: bool, why: str
) -> None:
    decision = decide(pipeline_objects(serving), pipeline_objects(*wanted), allowed)
    assert decision.plan is None
    assert decision.why_not.startswith(why) and bool(decision.why_not) == bool(why), decision


def fake_vllm(
    served: list[str], calls: list[str], refuse: str = "", speculating: list[bool] | None = None
) -> Any:
    """vLLM's weight routes as the keeper uses them: /weight_info answers served[0]; an update of
    a folder containing `refuse` is refused as the engine refuses it. The keeper's own switch
    route answers as over an engine whose speculation is speculating[0], or (None) as over a
    vLLM without patch 0002."""

    def respond(handler: Any) -> None:
        body = json.loads(handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
                          or b"{}")  # fmt: skip
        calls.append(handler.path)
        status, answer = 200, {}
        if handler.path.startswith(SPECULATION_PATH):
            status, answer = switch_answer(handler.path, speculating)
        elif handler.path == "/weight_info":
            answer = {"weight_version": served[0]}
        elif handler.path == "/update_weights" and refuse and refuse in body["update_info"]["path"]:
            status, answer = 500, {"error": f"x {SWAP_REFUSED} (y) without a restart: tensor z"}
        elif handler.path == "/finish_weight_update" and body.get("weight_version"):
            served[0] = body["weight_version"]
        elif handler.path.startswith("/reset_prefix_cache"):
            answer = {"success": True}
        raw = json.dumps(answer).encode()
        handler.send_response(status)
        handler.send_header("Content-Length", str(len(raw)))
        handler.end_headers()
        handler.wfile.write(raw)

    return respond


def switch_answer(path: str, speculating: list[bool] | None) -> tuple[int, dict[str, Any]]:
    """What the keeper's route answers over a (fake) engine: 501 without the switch."""
    if speculating is None:
        return 501, {"error": drafter_swap.NO_SWITCH}
    was = speculating[0]
    if "enabled=" in path:
        speculating[0] = path.endswith("enabled=true")
    changed = speculating[0] != was
    reset = True if changed and speculating[0] else None
    return 200, {"speculation": speculating[0], "changed": changed, "reset": reset}


def test_the_keeper_serves_what_the_spec_names_and_stops_on_a_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    spec = tmp_path / "spec.json"

    monkeypatch.setenv(DRAFTERS_ROOT_ENV, "/models")

    def wants(name: str) -> None:
        spec.write_text(json.dumps({"drafter": name, "drafter_path": f"/models/drafters/{name}"}))

    served, calls = ["default"], []
    with answering(fake_vllm(served, calls, refuse="shifted")) as address:
        keeper = drafter_swap.Keeper(f"http://{address}", spec, "good")
        wants("good")
        keeper.step()
        state = drafter_swap.read_keeper_state()
        assert (state["state"], state["serving"]) == ("serving", "good")
        # vLLM's "default" is the drafter it started with; this vLLM has no switch.
        assert calls == [SPECULATION_PATH, "/weight_info"]
        wants("untrained")
        keeper.step()
        state = drafter_swap.read_keeper_state()
        assert (state["state"], state["serving"], served[0]) == (
            "serving", "untrained",
            "untrained")  # fmt: skip
        assert state["swaps"][-1]["to"] == "untrained"
        wants("shifted")
        keeper.step()
        keeper.step()
        state = drafter_swap.read_keeper_state()
        assert state["state"] == "refused" and SWAP_REFUSED in state["reason"]
        assert calls.count("/update_weights") == 2  # the refused candidate is not tried again
        assert served[0] == "untrained"
        wants("good")
        keeper.step()
        assert drafter_swap.read_keeper_state()["serving"] == "good"


def test_the_keeper_answers_its_state_on_its_path_and_passes_everything_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))

    async def teapot_app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 418, "headers": []})

    keeper = drafter_swap.DrafterKeeper(teapot_app)  # no spec variable: it never starts a loop
    assert call(keeper, KEEPER_PATH, "10.4.0.7", None) == 200
    assert call(keeper, KEEPER_PATH + "/", "10.4.0.7", None) == 200
    assert call(keeper, "/v1/models", "10.4.0.7", None) == 418
    assert not keeper.started.is_set()
    assert drafter_swap.read_keeper_state()["state"] == "starting"
