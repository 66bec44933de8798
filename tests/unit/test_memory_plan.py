"""Every engine's memory plan, and the refusal before the load of one that cannot hold a request."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kimideploy.config.loading import LoadedProject, load_project
from kimideploy.errors import UsageError
from kimideploy.plan.model import PlanRequest
from kimideploy.plan.resolve import resolve

LONG = ("  max_model_len: 65536\n", "  max_model_len: 262144\n")


def memory_facts(loaded: LoadedProject, request: PlanRequest) -> list[str]:
    return [text for key, text in resolve(loaded, request).facts if key == "memory"]


def test_the_pcie_host_cannot_hold_one_262k_request_in_a_bf16_kv_cache(
    edited_config: Callable[..., Path],
) -> None:
    loaded = load_project(edited_config(LONG))
    with pytest.raises(UsageError) as info:
        resolve(loaded, PlanRequest("serve", "rtx6000", "v3"))
    message = info.value.message
    assert message.startswith(
        "nothing was created: the serve engine cannot hold one request of 262,144 tokens on "
        "8 x 96 GB"
    )
    # The numbers: MLA's 70,272 bytes per token (576 values x 61 layers x 2 bytes), plus the
    # drafter's one Llama layer in the same pages (2 x 8 KV heads / 8 ranks x 112 x 2 bytes = 448);
    # what every rank holds whole (MLA's down-projections and the routers: 2.0 GiB) and the MLA
    # workspace with the sampler's rows (0.9 GiB) before the KV cache.
    assert "KV 70,720 B/token holds 122,112 tokens = 0.5 requests of 262,144" in message
    assert (
        "weights 69.0 + replicated 2.0 + drafter 0.5 + activations 1.7 + workspace 0.9 + KV "
        "cache 8.0 of 82.3 GiB" in message
    )
    hint = info.value.hint or ""
    assert "max_model_len of at most 122,112" in hint and "kv_cache_dtype: fp8" in hint
    # An fp8 KV cache halves the bytes per token (twice the tokens), and with 0.95 of the GPU
    # the same request fits.
    batched = (
        "        max_num_batched_tokens: 8192   # a smaller step keeps decode latency on PCIe\n"
    )
    fp8 = batched + "        kv_cache_dtype: fp8\n        gpu_memory_utilization: 0.95\n"
    [line] = memory_facts(load_project(edited_config(LONG, (batched, fp8))),
                          PlanRequest("serve", "rtx6000", "v3"))  # fmt: skip
    assert "KV 35,360 B/token holds 325,672 tokens = 1.2 requests of 262,144" in line


def test_every_engine_prints_its_memory(example: LoadedProject) -> None:
    [serve] = memory_facts(example, PlanRequest("serve", "b300", "none"))
    assert serve.startswith("serve, per GPU of 8: weights 69.0 + replicated 2.0 + activations")
    [extract] = memory_facts(example, PlanRequest("extract", "b300"))
    assert extract.startswith("extraction, per GPU of 8:") and "hidden states" in extract
    assert memory_facts(example, PlanRequest("vocab", "b300")) == []  # no engine


def test_the_online_sidecar_is_planned_on_its_own_gpus(example: LoadedProject) -> None:
    online = [text for key, text in resolve(example, PlanRequest("train", "b300")).facts
              if key == "memory"]  # fmt: skip
    assert len(online) == 1 and online[0].startswith(
        "online target server, per GPU of 4: weights 138.0 + replicated 2.0"
    )
