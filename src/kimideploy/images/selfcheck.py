"""Proof that each vLLM patch took effect, or that the pinned vLLM natively does what a patch did;
run at the end of the image build and by the tests.

`python -m kimideploy.images.selfcheck CHECK...` imports the image's vLLM and checks the behaviour
each named patch (or `native-*` capability) promises; any failure exits non-zero, which fails the
docker build. `checks_for(image)` names the checks an image's Dockerfile runs.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable

from kimideploy.config.images import SUFFIX_SELFCHECK


def _allowlist() -> str:
    from vllm.config.speculative import SpeculativeConfig

    source = inspect.getsource(SpeculativeConfig)
    assert '"kimi_k2"' in source and '"deepseek_v3"' in source, "EAGLE-3 allowlist lacks Kimi-K2.5"
    return "EAGLE-3 allowlist includes deepseek_v3 and kimi_k2"


def _media_placeholder() -> str:
    from vllm.v1.spec_decode.eagle import EagleProposer

    source = inspect.getsource(EagleProposer.load_model)
    assert "KimiK25ForConditionalGeneration" in source and "media_placeholder_token_id" in source, (
        "the drafter still reads image_token_index from Kimi-K2.5's config"
    )
    return "drafter loading maps Kimi-K2.5's media_placeholder_token_id"


def _supports_eagle3() -> str:
    from vllm.model_executor.models.deepseek_v2 import DeepseekV3ForCausalLM
    from vllm.model_executor.models.interfaces import supports_eagle3
    from vllm.model_executor.models.kimi_k25 import KimiK25ForConditionalGeneration

    assert supports_eagle3(DeepseekV3ForCausalLM), "DeepseekV3ForCausalLM lacks SupportsEagle3"
    assert supports_eagle3(KimiK25ForConditionalGeneration), "Kimi-K2.5 lacks SupportsEagle3"
    return "SupportsEagle3 on DeepseekV3ForCausalLM and KimiK25ForConditionalGeneration"


def _native_no_allowlist() -> str:
    from vllm.config.speculative import SpeculativeConfig

    source = inspect.getsource(SpeculativeConfig)
    assert "is only supported for" not in source, "this vLLM still limits EAGLE-3 to an allowlist"
    return "no EAGLE-3 target allowlist (patch 0001 of vLLM 0.16 is unnecessary)"


def _native_media_placeholder() -> str:
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    source = inspect.getsource(SpecDecodeBaseProposer.load_model)
    assert "media_placeholder_token_id" in source, "the drafter loader ignores Kimi-K2.5's media id"
    return "drafter loading reads Kimi-K2.5's media_placeholder_token_id (0002 unnecessary)"


def _native_final_aux_layer() -> str:
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2Model

    source = inspect.getsource(DeepseekV2Model.forward)
    assert "self.end_layer in self.aux_hidden_state_layers" in source, (
        "DeepseekV2Model cannot return the final pre-norm hidden state as an aux layer"
    )
    return "DeepseekV2Model returns aux id num_hidden_layers (the final pre-norm state)"


def _mla_drafter_kimi_k2() -> str:
    import vllm.config  # noqa: F401  (the convertor module must not be the first vLLM import)
    from transformers import DeepseekV3Config
    from vllm.transformers_utils.configs.eagle import EAGLEConfig
    from vllm.transformers_utils.model_arch_config_convertor import (
        ModelArchConfigConvertorBase,
    )

    drafter = DeepseekV3Config(
        kv_lora_rank=16,
        q_lora_rank=32,
        num_hidden_layers=1,
        architectures=["Eagle3DeepseekV2ForCausalLM"],
    )
    drafter.model_type = "kimi_k2"  # what the Kimi MLA drafters' config.json says
    wrapped = EAGLEConfig(drafter, method="eagle3", model_type="eagle")
    assert ModelArchConfigConvertorBase(wrapped, wrapped).is_deepseek_mla(), (
        "a kimi_k2 MLA EAGLE-3 drafter is not detected as MLA"
    )
    return "a kimi_k2 MLA EAGLE-3 drafter is detected as MLA"


def _suffix_decoding() -> str:
    from arctic_inference.suffix_decoding import SuffixDecodingCache
    from vllm.utils.import_utils import has_arctic_inference

    assert has_arctic_inference(), "vLLM does not find Arctic Inference: suffix decoding fails"
    cache = SuffixDecodingCache(max_tree_depth=8, max_cached_requests=4)
    return f"suffix decoding: Arctic Inference's {type(cache).__name__} builds and vLLM finds it"


SUFFIX_CHECK = SUFFIX_SELFCHECK

CHECKS: dict[str, Callable[[], str]] = {
    "0001-eagle3-allow-kimi-k25-target.patch": _allowlist,
    "0002-kimi-k25-media-placeholder-in-drafter.patch": _media_placeholder,
    "0003-kimi-k25-supports-eagle3.patch": _supports_eagle3,
    "native-no-eagle3-allowlist": _native_no_allowlist,
    "native-kimi-k25-media-placeholder": _native_media_placeholder,
    "native-kimi-k25-supports-eagle3": _supports_eagle3,
    "native-deepseek-final-aux-layer": _native_final_aux_layer,
    "0001-mla-eagle3-drafter-kimi-k2.patch": _mla_drafter_kimi_k2,
    SUFFIX_CHECK: _suffix_decoding,
}

NATIVE_FROM = (0, 32)
"""From vLLM 0.32 every patch kimideploy carried is upstream; these checks prove it per image."""
NATIVE_CHECKS = tuple(name for name in CHECKS if name.startswith("native-"))


def checks_for(vllm: str | None, patches: list[str], suffix: bool = False) -> list[str]:
    """The self-checks an image runs: its patches', the native ones from vLLM 0.32 on, and
    suffix decoding's where the image carries Arctic Inference."""
    if vllm is None:
        return list(patches)
    major, minor = (int(part) for part in vllm.split(".")[:2])
    native = NATIVE_CHECKS if (major, minor) >= NATIVE_FROM else ()
    return [*patches, *native, *((SUFFIX_CHECK,) if suffix else ())]


def run(patches: list[str]) -> list[tuple[str, bool, str]]:
    """(patch, ok, message) for each patch; an unknown patch name is a failure (no silent pass)."""
    results = []
    for name in patches:
        check = CHECKS.get(name)
        if check is None:
            results.append((name, False, "no self-check is defined for this patch"))
            continue
        try:
            results.append((name, True, check()))
        except Exception as exc:  # any failure of the check is a failed patch
            results.append((name, False, f"{type(exc).__name__}: {exc}"))
    return results


def main(argv: list[str]) -> int:
    results = run(argv)
    for name, ok, message in results:
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {message}", file=sys.stderr)
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
