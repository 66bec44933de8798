"""What a live swap reads and whom the keeper obeys: the candidate folder read once, as untrusted
input (no FIFO waited on, no link followed, bounded), a tensor shared with the target refused by
name, a spec naming a folder outside the models mount or files other than the release's refused
before the engine is asked, the swap token's floor, and what the keeper tells clients outside the
pod. The same cases on the engine (real vLLM on CPU): tests/pipeline/test_swap_safety.py."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.loading import LoadedProject
from kimideploy.formats.drafter_swap import (
    DRAFTERS_ROOT_ENV,
    SWAP_REFUSED,
    folder_id,
    hold_drafter,
    sha256_mismatches,
    shared_refusals,
    swap_refusals,
)
from kimideploy.plan.model import PlanRequest
from kimideploy.plan.resolve import resolve
from kimideploy.plan.serve import drafter_sha256
from kimideploy.services.release.swap import FOREIGN, pod_swap, summary
from kimideploy.workloads import drafter_swap
from tests.local_http import answering
from tests.unit.test_drafter_swap import CONFIG as DRAFTER_CONFIG
from tests.unit.test_drafter_swap import (
    GUARDED,
    TENSORS,
    call,
    drafter,
    fake_vllm,
    reached_app,
)


def held_within(folder: Path, seconds: float = 10.0) -> Any:
    """hold_drafter in a thread: a reader that blocks (a FIFO read with a blocking open) fails
    the test instead of hanging it."""
    found: list[Any] = []
    thread = threading.Thread(target=lambda: found.append(hold_drafter(folder)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert found, f"reading {folder} did not return within {seconds}s"
    return found[0]


def test_a_fifo_config_is_refused_at_once_not_waited_on(tmp_path: Path) -> None:
    candidate = drafter(tmp_path / "b")
    (candidate / "config.json").unlink()
    os.mkfifo(candidate / "config.json")
    held = held_within(candidate)
    assert held.problems == [f"{candidate}/config.json: not a regular file"]
    assert swap_refusals(hold_drafter(drafter(tmp_path / "a")), held) == held.problems


def test_links_are_refused_not_followed(tmp_path: Path) -> None:
    running = hold_drafter(drafter(tmp_path / "a"))
    # A link to /dev/zero would be read until memory runs out.
    zero = drafter(tmp_path / "zero")
    (zero / "model.safetensors").unlink()
    (zero / "model.safetensors").symlink_to("/dev/zero")
    held = held_within(zero)
    assert held.problems == [f"{zero}/model.safetensors: is a symbolic link; refusing to follow it"]
    # A config.json linked to the running drafter's (outside the candidate) is not borrowed.
    borrowed = drafter(tmp_path / "borrowed")
    (borrowed / "config.json").unlink()
    (borrowed / "config.json").symlink_to(tmp_path / "a" / "config.json")
    assert swap_refusals(running, hold_drafter(borrowed)) == [
        f"{borrowed}/config.json: is a symbolic link; refusing to follow it"
    ]
    # Nor a folder reached through a link.
    (tmp_path / "alias").symlink_to(tmp_path / "a")
    [problem] = hold_drafter(tmp_path / "alias").problems
    assert problem.startswith(f"{tmp_path / 'alias'}: reached through a symbolic link")


def test_a_planted_file_over_the_limit_is_not_read(tmp_path: Path) -> None:
    big = drafter(tmp_path / "big")
    with (big / "model.safetensors").open("r+b") as handle:
        handle.truncate(4096)
    held = hold_drafter(big, limit=1024)
    assert held.problems == [f"{big}/model.safetensors: 4,096 bytes, over the 1,024-byte limit"]
    assert "model.safetensors" not in held.files


def test_half_written_candidates_are_refused_with_the_file_and_the_problem(
    tmp_path: Path,
) -> None:
    running = hold_drafter(drafter(tmp_path / "a"))
    zero_data = drafter(tmp_path / "header-only")
    whole = (zero_data / "model.safetensors").read_bytes()
    header_end = 8 + int.from_bytes(whole[:8], "little")
    (zero_data / "model.safetensors").write_bytes(whole[:header_end])
    [problem] = swap_refusals(running, hold_drafter(zero_data))
    assert problem.startswith(f"{zero_data}/model.safetensors: truncated")
    cut = drafter(tmp_path / "cut")
    (cut / "model.safetensors").write_bytes(whole[: len(whole) - 100])
    [problem] = swap_refusals(running, hold_drafter(cut))
    assert problem.startswith(f"{cut}/model.safetensors: truncated")


def test_the_folder_is_read_once_what_changes_afterwards_is_not_loaded(tmp_path: Path) -> None:
    candidate = drafter(tmp_path / "b")
    held = hold_drafter(candidate)
    digests = held.sha256s()
    lm_head = held.tensor_digest("lm_head.weight")
    # The volume's file replaced between the judgement and the load (another config, new bytes).
    (candidate / "config.json").write_text(json.dumps({**DRAFTER_CONFIG, "draft_vocab_size": 9}))
    with (candidate / "model.safetensors").open("r+b") as handle:
        handle.seek(-8, os.SEEK_END)
        handle.write(b"\x7f" * 8)
    assert held.sha256s() == digests and held.tensor_digest("lm_head.weight") == lm_head
    assert held.config["draft_vocab_size"] == 512
    assert hold_drafter(candidate).sha256s() != digests


def test_files_other_than_the_releases_are_named(tmp_path: Path) -> None:
    candidate = drafter(tmp_path / "b")
    held = hold_drafter(candidate)
    real = hashlib.sha256((candidate / "model.safetensors").read_bytes()).hexdigest()
    assert sha256_mismatches(held, {"model.safetensors": real}) == []
    [found] = sha256_mismatches(held, {"model.safetensors": "0" * 64})
    assert found == (
        f"{candidate}/model.safetensors: sha256 {real[:12]}..., the release recorded 000000000000..."
    )
    [missing] = sha256_mismatches(held, {"model-00002.safetensors": real})
    assert missing.endswith("missing (the release lists it)")


def test_a_tensor_shared_with_the_target_is_refused_by_name_when_its_values_differ(
    tmp_path: Path,
) -> None:
    with_embed = {**TENSORS, "embed_tokens.weight": ("BF16", [512, 128])}
    running = hold_drafter(drafter(tmp_path / "a", tensors=with_embed))
    same = hold_drafter(drafter(tmp_path / "same", tensors=with_embed))
    assert shared_refusals(running, same, {"embed_tokens.weight"}) == []
    trained = drafter(tmp_path / "trained", tensors=with_embed)
    header, base = hold_drafter(trained).headers["model.safetensors"]
    start = base + header["embed_tokens.weight"]["data_offsets"][0]
    with (trained / "model.safetensors").open("r+b") as handle:
        handle.seek(start)
        handle.write(b"\x01\x3f")
    [refusal] = shared_refusals(running, hold_drafter(trained), {"embed_tokens.weight"})
    assert refusal.startswith("tensor embed_tokens.weight: its parameter is the target's own")
    # What is not shared may differ: that is what a swap is for.
    assert shared_refusals(running, hold_drafter(trained), {"lm_head.weight"}) == []


@pytest.mark.parametrize(
    ("folder", "named"),
    [
        ("/tmp/evil", "not under the models mount /models"),
        ("/models/drafters/../../tmp/evil", "not a plain absolute path"),
        ("/models//drafters/x", "not a plain absolute path"),
        ("drafters/x", "not a plain absolute path"),
        ("/modelsx/drafters/x", "not under the models mount /models"),
    ],
)
def test_the_keeper_takes_only_folders_under_the_models_mount(folder: str, named: str) -> None:
    assert named in (drafter_swap.folder_refusal(folder, "/models") or "")
    assert drafter_swap.folder_refusal("/models/drafters/x", "/models") is None
    assert "is not set" in (drafter_swap.folder_refusal("/models/drafters/x", None) or "")


def test_a_link_under_the_mount_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "drafters").mkdir(parents=True)
    (root / "drafters" / "planted").symlink_to(tmp_path / "elsewhere")
    refusal = drafter_swap.folder_refusal(str(root / "drafters" / "planted"), str(root))
    assert refusal is not None and "symbolic link" in refusal


def keeper_for(tmp_path: Path, address: str, spec: dict[str, Any]) -> drafter_swap.Keeper:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return drafter_swap.Keeper(f"http://{address}", path, "good")


def test_a_spec_naming_a_folder_outside_the_mount_is_refused_before_the_engine_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv(DRAFTERS_ROOT_ENV, "/models")
    served, calls = ["default"], []
    with answering(fake_vllm(served, calls)) as address:
        for path in ("/tmp/evil", "/models/drafters/../../tmp/evil"):
            keeper = keeper_for(tmp_path, address, {"drafter": "good", "drafter_path": path})
            keeper.step()  # the name the record serves, another folder
            keeper.step()
            keeper = keeper_for(tmp_path, address, {"drafter": "v9", "drafter_path": path})
            keeper.step()
            state = drafter_swap.read_keeper_state()
            assert state["state"] == "refused" and SWAP_REFUSED in state["reason"], state
    assert "/update_weights" not in calls and served[0] == "default"


def test_files_other_than_the_spec_lists_are_refused_and_the_sha256s_reach_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    root = tmp_path / "models"
    monkeypatch.setenv(DRAFTERS_ROOT_ENV, str(root))
    folder = drafter(root / "drafters" / "v9")
    real = hold_drafter(folder).sha256s()
    served, calls, bodies = ["default"], [], []
    vllm = fake_vllm(served, calls)

    def recording(handler: Any) -> None:
        if handler.path == "/update_weights":
            length = int(handler.headers.get("Content-Length") or 0)
            raw = handler.rfile.read(length)
            bodies.append(json.loads(raw))
            handler.rfile = __import__("io").BytesIO(raw)
        vllm(handler)

    wrong = {**real, "model.safetensors": "0" * 64}
    with answering(recording) as address:
        spec = {"drafter": "v9", "drafter_path": str(folder), "drafter_sha256": wrong}
        keeper_for(tmp_path, address, spec).step()
        state = drafter_swap.read_keeper_state()
        assert state["state"] == "refused" and "model.safetensors: sha256" in state["reason"]
        assert "/update_weights" not in calls
        spec["drafter_sha256"] = real
        keeper_for(tmp_path, address, spec).step()
    state = drafter_swap.read_keeper_state()
    assert (state["state"], state["serving"], state["verified"]) == ("serving", "v9", True)
    assert bodies[-1]["update_info"] == {"path": str(folder), "sha256": real}


def test_the_serve_spec_lists_the_files_a_swap_reads(example: LoadedProject) -> None:
    from kimideploy.config.registry import OciArtifact

    v3 = example.project.eagle_drafter("v3").model_copy(update={"sha256": None})
    assert drafter_sha256(v3) == {}
    assert drafter_sha256(v3.model_copy(update={"sha256": "a" * 64})) == {
        "model.safetensors": "a" * 64
    }
    oci = OciArtifact(repository="ghcr.io/o/d", digest="sha256:" + "b" * 64,
                      files={"config.json": "c" * 64, "model.safetensors": "d" * 64,
                             "kimideploy-lineage.json": "e" * 64})  # fmt: skip
    source = v3.source.model_copy(update={"oci": oci, "path": None, "hub": None})
    published = v3.model_copy(update={"source": source})
    assert drafter_sha256(published) == {"config.json": "c" * 64, "model.safetensors": "d" * 64}
    pinned = example.project.model_copy(deep=True)
    pinned.drafters["v3"] = v3.model_copy(update={"sha256": "f" * 64})
    project = dataclasses.replace(example, project=pinned)
    [config_map] = [o for o in resolve(project, PlanRequest("serve", "b300", "v3")).objects
                    if o.template == "configmap-serve" and "spec.json" in o.values["data"]]  # fmt: skip
    spec = json.loads(config_map.values["data"]["spec.json"])
    assert spec["drafter_sha256"] == {"model.safetensors": "f" * 64}


def test_a_short_or_empty_token_keeps_the_routes_shut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    drafter_swap.token_path().write_text("  \n")
    with pytest.raises(drafter_swap.WeakTokenError, match="0 characters"):
        drafter_swap.DevRoutesGuard(reached_app, guarded=GUARDED)
    scope = {"client": ("127.0.0.1", 1), "headers": [(drafter_swap.TOKEN_HEADER.encode(), b"")]}
    assert not drafter_swap.from_the_pod(scope, "")
    # A link planted where the token goes is not read through.
    drafter_swap.token_path().unlink()
    (tmp_path / "chosen").write_text("x" * 64)
    drafter_swap.token_path().symlink_to(tmp_path / "chosen")
    with pytest.raises(drafter_swap.WeakTokenError, match="symbolic link"):
        drafter_swap.pod_token()


def test_the_engine_routes_a_shared_cluster_reaches_are_guarded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(drafter_swap, "dev_route_paths", frozenset)  # vLLM's own: pipeline tier
    guard = drafter_swap.DevRoutesGuard(reached_app)
    token = drafter_swap.pod_token()
    for path in ("/scale_elastic_ep", "/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        assert call(guard, path, "10.4.0.7", None) == 403, path
        assert call(guard, path, "127.0.0.1", token) == 200, path
    assert call(guard, "/v1/completions", "10.4.0.7", None) == 200


def test_outside_the_pod_the_keeper_answers_without_paths_or_server_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv(DRAFTERS_ROOT_ENV, "/models")
    token = drafter_swap.pod_token()
    refused = (
        f"/models/drafters/misfit {SWAP_REFUSED} (/models/drafters/good) without a restart: "
        "config.json rms_norm_eps: running 1e-06, candidate 0.001"
    )
    state = {"state": "refused", "wanted": "misfit", "serving": "good", "reason": refused,
             "folder": "/models/drafters/good", "pid": 7}  # fmt: skip
    drafter_swap.keeper_state_path().write_text(json.dumps(state))
    keeper = drafter_swap.DrafterKeeper(reached_app)
    outside = answer_of(keeper, "10.4.0.7", None)
    assert outside["reason"] == (
        f"misfit {SWAP_REFUSED} (good) without a restart: config.json rms_norm_eps: running "
        "1e-06, candidate 0.001"
    )
    assert "/models" not in json.dumps(outside) and "pid" not in outside
    assert outside["folder_id"] == folder_id("/models/drafters/good", "/models")
    assert answer_of(keeper, "127.0.0.1", token) == state
    failed = {"state": "failed", "reason": "/update_weights: HTTP 500: Traceback ... /usr/lib"}
    drafter_swap.keeper_state_path().write_text(json.dumps(failed))
    assert answer_of(keeper, "10.4.0.7", None)["reason"] == (
        "failed: the server's answer is in the serve container's log"
    )


def answer_of(keeper: Any, client: str, token: str | None) -> dict[str, Any]:
    import asyncio

    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    headers = [(drafter_swap.TOKEN_HEADER.encode(), token.encode())] if token else []
    scope = {"type": "http", "method": "GET", "path": drafter_swap.KEEPER_PATH, "root_path": "",
             "client": (client, 5), "headers": headers}  # fmt: skip
    asyncio.run(keeper(scope, receive, send))
    answer: dict[str, Any] = json.loads(sent[1]["body"])
    return answer


def test_status_names_a_pod_serving_the_wanted_name_from_another_folder() -> None:
    answer = {"state": "serving", "serving": "v3", "wanted": "v3",
              "folder_id": folder_id("/tmp/evil", "/models")}  # fmt: skip
    pod = pod_swap("serve-0", answer, "v3", True, "/models/drafters/v3")
    assert pod.state == FOREIGN
    assert "changed outside kimideploy" in summary([pod], "v3")
    assert summary([pod], "v3").startswith("0/1 pods serve v3")
    good = {**answer, "folder_id": folder_id("/models/drafters/v3", "/models")}
    # The same folder under another mount path (a node, the tier's local folders): the same id.
    assert folder_id("/mnt/volumes/models/drafters/v3", "/mnt/volumes/models") == good["folder_id"]
    assert pod_swap("serve-0", good, "v3", True, "/models/drafters/v3").state == "serving"
    started = {"state": "serving", "serving": "v3"}  # never swapped: the Deployment's own
    assert pod_swap("serve-0", started, "v3", True, "/models/drafters/v3").state == "serving"


def test_reading_a_candidate_is_quick_even_when_a_fifo_sits_beside_it(tmp_path: Path) -> None:
    candidate = drafter(tmp_path / "b")
    os.mkfifo(candidate / "extra.safetensors")
    began = time.monotonic()
    held = held_within(candidate)
    assert time.monotonic() - began < 5
    assert held.problems == [f"{candidate}/extra.safetensors: not a regular file"]


def test_a_keeper_still_on_the_previous_spec_is_waiting_not_foreign() -> None:
    """Right after `up`, the pod's volume holds the previous spec for up to a minute: its keeper
    serves the previous drafter from its own folder; that is the kubelet's delay, not a spec
    changed outside kimideploy."""
    answer = {"state": "serving", "serving": "untrained", "wanted": "untrained",
              "folder_id": folder_id("/models/drafters/untrained", "/models")}  # fmt: skip
    pod = pod_swap("serve-0", answer, "misfit", True, "/models/drafters/misfit")
    assert pod.state == "waiting"
