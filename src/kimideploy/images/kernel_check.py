#!/usr/bin/env python3
"""Run inside a vLLM virtualenv: which attention kernels would this vLLM pick on an absent GPU?

Standalone (imports only vLLM, torch and the standard library): `image kernels` runs it with the
pinned vLLM's interpreter, the image's patched sources first on PYTHONPATH, and a JSON spec
`{"archs": ["sm_120", ...], "engines": {"target": {...}, "drafter": {...}}}`. For each compute
capability it evaluates vLLM's own selection code (the CUDA platform's backend priorities, each
backend's validate_configuration, the chosen backend's metadata builder) with the capability
given instead of read from a device. Prints one JSON object.

What makes that possible on a machine without a GPU: the compiled extension modules vLLM imports
at the top of its CUDA platform (vllm._C, FlashInfer, ...) are replaced by empty stand-ins, and
the platform's capability queries answer with the capability under test. Nothing it evaluates
runs a kernel: the priorities and the validations are Python over class attributes. A backend
whose validation still needs the device (it queries the driver) is reported as undetermined,
never guessed.

Under the real configs: the spec's `configs` (the target's config.json, each drafter's, the
tensor-parallel size and k) become the engine's own VllmConfig, built by vLLM from those files with
the speculative config, so a refusal that reads the model (FlashInfer-MLA's qk_nope_head_dim) is
evaluated, the selector is handed what vLLM's `get_attn_backend` hands it for that configuration
(block size, adaptive verification, connector, context parallelism), and a builder's CUDA-graph
support is asked with the engine's config and KV spec, as the model runner asks it. A vLLM that
cannot build the config here (0.16 lacks parts the stand-ins need) is evaluated under an empty one,
and the answer says so (`evaluated_with`).

The verdict that matters for speculation: the chosen MLA backend's builder declares which query
lengths its decode pipeline takes (vLLM's QueryLenSupport). SINGLE_ONLY sends every (k+1)-token
verification through MLA's prefill path over the whole context; UNIFORM or VARLEN verify on the
decode path.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import json
import sys
import types
from typing import Any

STUBBED_PREFIXES = (
    "vllm._C", "vllm._moe_C", "vllm._flashmla", "vllm._rocm", "vllm.vllm_flash_attn",
    "vllm._custom", "vllm.cumem_allocator", "flashinfer", "tokenspeed_mla",
)  # fmt: skip
"""Compiled or GPU-only modules the selection code imports but never calls here."""


class _Absent(types.ModuleType):
    """A stand-in module: every attribute is another stand-in, callable, never useful."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Absent(f"{self.__name__}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _Absent(f"{self.__name__}()")

    def __or__(self, other: Any) -> Any:  # `Absent | None` in a module-level annotation
        return self

    __ror__ = __or__


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        # flashinfer_cubin is a package of its own: whether the image has the cubins is the
        # spec's `flashinfer_cubins`, never a stand-in's presence.
        if name.startswith(STUBBED_PREFIXES) and not name.startswith("flashinfer_cubin"):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> Any:
        module = _Absent(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: Any) -> None:
        return None


def _filtered(function: Any, values: dict[str, Any]) -> dict[str, Any]:
    names = inspect.signature(function).parameters
    return {k: v for k, v in values.items() if k in names}


def _platform(major: int, minor: int, devices: int = 8) -> Any:
    """vLLM's CUDA platform answering for the capability under test."""
    import vllm.platforms as platforms
    import vllm.platforms.cuda as cuda
    from vllm.platforms.interface import DeviceCapability

    capability = DeviceCapability(major, minor)
    value = major * 10 + minor

    def as_int(asked: Any) -> int:
        if isinstance(asked, tuple):  # (major, minor), as some callers ask
            return int(asked[0]) * 10 + int(asked[1])
        return asked if isinstance(asked, int) else int(asked.to_int())

    platform = cuda.CudaPlatform
    platform.get_device_capability = classmethod(lambda cls, device_id=0: capability)
    platform.has_device_capability = classmethod(
        lambda cls, asked, device_id=0: value >= as_int(asked)
    )
    platform.is_device_capability = classmethod(
        lambda cls, asked, device_id=0: value == as_int(asked)
    )
    platform.is_device_capability_family = classmethod(
        lambda cls, asked, device_id=0: value // 10 == as_int(asked) // 10
    )
    # The world size the engine is configured for: ParallelConfig refuses a tensor-parallel size
    # larger than the GPUs it counts.
    platform.device_count = classmethod(lambda cls: devices)
    platforms._current_platform = platform()
    import torch

    # Validations that ask torch for the device get the same answer as the platform, and a
    # backend module that allocates its workspace on the GPU at import gets a tensor without
    # storage (torch's meta device): nothing here reads it.
    torch.cuda.get_device_capability = lambda device=None: (major, minor)
    for factory in ("zeros", "empty", "ones", "full"):
        setattr(torch, factory, _off_the_gpu(getattr(torch, factory)))
    return cuda, capability


def _off_the_gpu(factory: Any) -> Any:
    if getattr(factory, "_kimideploy_meta", False):
        return factory

    def allocate(*args: Any, **kwargs: Any) -> Any:
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "meta"
        return factory(*args, **kwargs)

    allocate._kimideploy_meta = True  # type: ignore[attr-defined]
    return allocate


class _AskedError(Exception):
    """Raised where vLLM would pick a backend: what it was asked is all that is wanted here."""

    def __init__(self, config: Any) -> None:
        super().__init__("asked")
        self.config = config


def _selector_config(engine: dict[str, Any]) -> Any:
    """What vLLM's own get_attn_backend hands the platform for this engine under the current
    VllmConfig (the block size, adaptive verification, a connector, context parallelism all come
    from it), caught before the platform chooses; an older vLLM's selector: built here."""
    import torch
    from vllm.v1.attention import selector

    cached = getattr(selector, "_cached_get_attn_backend", None)
    if cached is not None and "attn_selector_config" in inspect.signature(cached).parameters:

        def asked(backend: Any, attn_selector_config: Any, *args: Any, **kwargs: Any) -> Any:
            raise _AskedError(attn_selector_config)

        selector._cached_get_attn_backend = asked
        try:
            selector.get_attn_backend(
                **_filtered(selector.get_attn_backend, {
                    "head_size": engine["head_size"], "dtype": torch.bfloat16,
                    "kv_cache_dtype": engine.get("kv_cache_dtype", "auto"),
                    "use_mla": engine["use_mla"], "num_heads": engine.get("num_heads"),
                    "block_size": None,  # 0.16 asks for it; the cache config decides it later
                })
            )  # fmt: skip
        except _AskedError as caught:
            return caught.config
        finally:
            selector._cached_get_attn_backend = cached
    return _built_selector_config(engine)


def _built_selector_config(engine: dict[str, Any]) -> Any:
    import torch
    from vllm.v1.attention.selector import AttentionSelectorConfig

    values: dict[str, Any] = dict.fromkeys(AttentionSelectorConfig._fields, False)
    values.update(
        head_size=engine["head_size"],
        dtype=torch.bfloat16,
        kv_cache_dtype=engine.get("kv_cache_dtype", "auto"),
        block_size=None,
        use_mla=engine["use_mla"],
        attn_type="decoder",
    )
    return AttentionSelectorConfig(**values)


def _kv_cache_spec(engine: dict[str, Any], config: Any) -> Any:
    """The engine's KV cache spec as the model runner builds it per layer: MLA's one latent
    per token; a llama head's KV heads on this rank."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

    block = config.block_size or 16
    if engine["use_mla"]:
        return MLAAttentionSpec(
            block_size=block, num_kv_heads=1, head_size=engine["head_size"], dtype=torch.bfloat16
        )
    return FullAttentionSpec(
        block_size=block, num_kv_heads=engine.get("num_kv_heads", 1),
        head_size=engine["head_size"], dtype=torch.bfloat16,
    )  # fmt: skip


def _cudagraph_support(builder: Any, engine: dict[str, Any], config: Any) -> str | None:
    """The builder's answer for this engine's config and KV spec (FlashInfer's reads the heads
    and the TRT-LLM kernels' availability); its class default where this vLLM has no such
    question or the answer needs what a stand-in cannot give."""
    from vllm.config import get_current_vllm_config_or_none

    vllm_config = get_current_vllm_config_or_none()
    ask = getattr(builder, "get_cudagraph_support", None)
    if ask is not None and vllm_config is not None and vllm_config.model_config is not None:
        try:
            return _name(ask(vllm_config, _kv_cache_spec(engine, config)))
        except Exception as exc:  # a stand-in was asked: not a verdict
            return f"undetermined ({type(exc).__name__})"
    return _name(getattr(builder, "_cudagraph_support", None))


def _backend_class(cuda: Any, backend: Any) -> Any:
    find = getattr(cuda, "_get_attn_backend_class", None)
    return find(backend) if find is not None else backend.get_class()


def _name(value: Any) -> str | None:
    return None if value is None else str(getattr(value, "name", value))


def select(cuda: Any, capability: Any, engine: dict[str, Any]) -> dict[str, Any]:
    """The candidates in vLLM's order, each valid, invalid (its reasons) or undetermined, and
    the one vLLM would take with its builder's query-length and CUDA-graph support."""
    config = _selector_config(engine)
    priorities = cuda._get_backend_priorities(
        **_filtered(cuda._get_backend_priorities, {
            "use_mla": engine["use_mla"], "device_capability": capability,
            "num_heads": engine.get("num_heads"), "kv_cache_dtype": config.kv_cache_dtype,
            "head_size": engine["head_size"], "use_non_causal": False, "use_mm_prefix": False,
        })
    )  # fmt: skip
    candidates, chosen, undetermined = [], None, []
    for backend in priorities:
        entry: dict[str, Any] = {"backend": backend.name}
        try:
            backend_class = _backend_class(cuda, backend)
            reasons = backend_class.validate_configuration(
                device_capability=capability, **config._asdict()
            )
        except Exception as exc:  # the device or a library this machine lacks: not a verdict
            entry["undetermined"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            undetermined.append(backend.name)
            candidates.append(entry)
            continue
        entry["reasons"] = list(reasons or [])
        if not reasons:
            builder = backend_class.get_builder_cls()
            entry["query_len_support"] = _name(getattr(builder, "query_len_support", None))
            entry["cudagraph_support"] = _cudagraph_support(builder, engine, config)
            if chosen is None:
                chosen = entry
        candidates.append(entry)
    order = [c["backend"] for c in candidates]
    last = order.index(chosen["backend"]) if chosen is not None else len(order)
    ahead = [name for name in undetermined if order.index(name) < last]
    return {"candidates": candidates, "selected": chosen, "undetermined_ahead": ahead}


FLASHINFER_MOE = "FLASHINFER"
"""Backends whose kernels are FlashInfer's: with FlashInfer a stand-in here, whether the image's
FlashInfer has them cannot be told on CPU (reported undetermined, as attention's are)."""


def _moe_config(moe: dict[str, Any]) -> Any:
    """vLLM's FusedMoEConfig for the target's routed experts on `tensor_parallel` GPUs."""
    import torch
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig,
        FusedMoEParallelConfig,
        RoutingMethodType,
    )

    parallel = FusedMoEParallelConfig(
        tp_size=moe["tensor_parallel"], pcp_size=1, dp_size=1, ep_size=1, tp_rank=0, pcp_rank=0,
        dp_rank=0, ep_rank=0, sp_size=1, use_ep=False, all2all_backend="allgather_reducescatter",
        enable_eplb=False,
    )  # fmt: skip
    return FusedMoEConfig(
        num_experts=moe["experts"], experts_per_token=moe["experts_per_token"],
        hidden_dim=moe["hidden"], intermediate_size=moe["intermediate"],
        num_local_experts=moe["experts"], num_logical_experts=moe["experts"],
        activation=MoEActivation.SILU, device="cuda", routing_method=RoutingMethodType.DeepSeekV3,
        moe_parallel_config=parallel, in_dtype=torch.bfloat16,
        moe_backend=moe.get("moe_backend", "auto"),
    )  # fmt: skip


def select_moe(moe: dict[str, Any]) -> dict[str, Any]:
    """The experts kernel vLLM's oracle picks for the target's quantization, under the
    capability being evaluated: W4A16 group 32 (compressed-tensors INT4, Kimi-K2.5's) or NVFP4.
    A FlashInfer kernel ahead of the choice is reported undetermined, with what vLLM takes
    without it (the choice where the image's FlashInfer lacks it)."""
    config = _moe_config(moe)
    if moe["quantization"] == "nvfp4":
        from vllm.model_executor.layers.fused_moe.oracle import nvfp4
        from vllm.model_executor.layers.quantization.utils.quant_utils import (
            kNvfp4Dynamic,
            kNvfp4Static,
        )

        backend, experts = nvfp4.select_nvfp4_moe_backend(config, kNvfp4Static, kNvfp4Dynamic)
        chosen = {"backend": backend.value, "experts": experts.__name__}
        flashinfer = [backend.value] if backend.value.startswith(FLASHINFER_MOE) else []
        return {"selected": chosen, "undetermined_ahead": flashinfer}
    from compressed_tensors.quantization import QuantizationArgs, QuantizationStrategy
    from vllm.model_executor.layers.fused_moe.oracle import int_wna16
    from vllm.model_executor.layers.quantization.utils.quant_utils import kInt4Static32

    group = QuantizationStrategy.GROUP
    args = QuantizationArgs(
        num_bits=4, type="int", symmetric=True, strategy=group, group_size=moe["group_size"]
    )

    def pick() -> tuple[str, str]:
        backend, experts = int_wna16.select_wna16_moe_backend(
            config, kInt4Static32, args, may_have_zp=False, may_have_bias=False
        )
        return backend.value, experts.__name__

    backend, experts = pick()
    undetermined: list[str] = []
    if backend.startswith(FLASHINFER_MOE):
        undetermined.append(backend)
        ordered = int_wna16._get_priority_backends
        int_wna16._get_priority_backends = lambda: [
            b for b in ordered() if not b.value.startswith(FLASHINFER_MOE)
        ]
        try:
            backend, experts = pick()
        finally:
            int_wna16._get_priority_backends = ordered
    return {
        "selected": {"backend": backend, "experts": experts},
        "undetermined_ahead": undetermined,
    }


def _cubins_are(baked: bool) -> None:
    """Imported after the platform is the one under test (the module binds it at import)."""
    try:
        from vllm.utils import flashinfer as flashinfer_utils
    except ImportError:  # an older vLLM keeps it elsewhere, or asks nothing
        return
    flashinfer_utils.has_nvidia_artifactory = lambda: baked


def _moe_or_absent(moe: dict[str, Any]) -> dict[str, Any]:
    try:
        return select_moe(moe)
    except (ImportError, AttributeError, TypeError) as exc:
        # An older vLLM (0.16) has no such oracle: not derived, never guessed.
        return {
            "selected": None,
            "undetermined_ahead": [f"{type(exc).__name__}: {str(exc)[:120]}"],
        }


def _engine_config(configs: dict[str, Any], drafter: str | None, folder: str) -> Any:
    """The VllmConfig vLLM builds for the target's config.json served at the tensor-parallel
    size, with the drafter's config.json as its EAGLE-3 speculative config (none: the target
    alone). Eager, and without the all-reduce fusion pass: both only decide compilation, which
    needs the compiled ops the stand-ins replace."""
    from pathlib import Path

    from vllm.config import (
        CacheConfig,
        CompilationConfig,
        ModelConfig,
        ParallelConfig,
        PassConfig,
        SpeculativeConfig,
        VllmConfig,
    )

    def written(name: str, config: dict[str, Any]) -> str:
        path = Path(folder) / name
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(config))
        return str(path)

    model = ModelConfig(
        model=written("target", configs["target"]), skip_tokenizer_init=True, dtype="bfloat16",
        max_model_len=configs["max_model_len"], enforce_eager=True, trust_remote_code=False,
    )  # fmt: skip
    parallel = ParallelConfig(tensor_parallel_size=configs["tensor_parallel"])
    speculative = None
    if drafter is not None:
        speculative = SpeculativeConfig(
            method="eagle3", model=written(drafter, configs["drafters"][drafter]),
            num_speculative_tokens=configs["num_speculative_tokens"],
            target_model_config=model, target_parallel_config=parallel,
        )  # fmt: skip
    # 0.16 reserves CPU swap per GPU and refuses more than this machine's memory: none here.
    cache = CacheConfig(**_filtered(CacheConfig, {"swap_space": 0}))
    return VllmConfig(
        model_config=model, parallel_config=parallel, speculative_config=speculative,
        cache_config=cache,
        compilation_config=CompilationConfig(pass_config=PassConfig(fuse_allreduce_rms=False)),
    )  # fmt: skip


def _configs_for(spec: dict[str, Any], folder: str) -> tuple[dict[str, Any], str]:
    """Per engine, the VllmConfig it is evaluated under, and what that config is."""
    from vllm.config import VllmConfig

    configs = spec.get("configs")
    engines = [*spec["engines"], *(spec.get("moe") or {})]
    if not configs:
        return dict.fromkeys(engines, VllmConfig()), "an empty VllmConfig"
    try:
        with_drafter = {name: _engine_config(configs, name, folder) for name in configs["drafters"]}
        target = _engine_config(configs, next(iter(configs["drafters"]), None), folder)
    except Exception as exc:  # an older vLLM: evaluated without the model, and said so
        reason = f"{type(exc).__name__}: {str(exc)[:160]}"
        return dict.fromkeys(engines, VllmConfig()), f"an empty VllmConfig ({reason})"
    chosen = {name: with_drafter.get(name, target) for name in engines}
    return chosen, "the model's and drafters' config.json, with the speculative config"


def main() -> int:
    import tempfile

    spec = json.loads(sys.stdin.read())
    sys.meta_path.insert(0, _StandIns())
    import os

    # Whether TRT-LLM attention's cubins are there is the image's fact (baked in, and
    # VLLM_HAS_FLASHINFER_CUBIN set), never this machine's network.
    os.environ["VLLM_HAS_FLASHINFER_CUBIN"] = "1" if spec.get("flashinfer_cubins") else "0"
    import vllm
    from vllm.config import set_current_vllm_config

    found: dict[str, Any] = {"vllm": vllm.__version__, "archs": {}}
    devices = (spec.get("configs") or {}).get("tensor_parallel", 8)
    for arch in spec["archs"]:
        digits = arch.removeprefix("sm_").rstrip("af")
        cuda, capability = _platform(int(digits[:-1]), int(digits[-1]), devices)
        _cubins_are(bool(spec.get("flashinfer_cubins")))
        with tempfile.TemporaryDirectory() as folder:
            per_engine, evaluated_with = _configs_for(spec, folder)
            found["evaluated_with"] = evaluated_with
            found["archs"][arch] = {}
            for name, engine in spec["engines"].items():
                with set_current_vllm_config(per_engine[name]):
                    found["archs"][arch][name] = select(cuda, capability, engine)
            for name, moe in (spec.get("moe") or {}).items():
                with set_current_vllm_config(per_engine[name]):
                    found["archs"][arch][name] = _moe_or_absent(moe)
    print(json.dumps(found))  # the last line: vLLM may log to stdout before it
    return 0


if __name__ == "__main__":
    sys.exit(main())
