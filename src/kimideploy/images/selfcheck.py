"""Proof that each vLLM patch took effect; run at the end of the image build and by `image verify`.

`python -m kimideploy.images.selfcheck PATCH...` imports the patched vLLM and checks the behaviour
each named patch promises; any failure exits non-zero, which fails the docker build.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable


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


def _final_aux_layer() -> str:
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2Model

    source = inspect.getsource(DeepseekV2Model.forward)
    assert "len(self.layers) in self.aux_hidden_state_layers" in source, (
        "DeepseekV2Model cannot return the final pre-norm hidden state as an aux layer"
    )
    return "DeepseekV2Model returns aux id len(layers) (pre-norm final hidden state)"


CHECKS: dict[str, Callable[[], str]] = {
    "0001-eagle3-allow-kimi-k25-target.patch": _allowlist,
    "0002-kimi-k25-media-placeholder-in-drafter.patch": _media_placeholder,
    "0003-kimi-k25-supports-eagle3.patch": _supports_eagle3,
    "0001-deepseek-final-hidden-state-as-aux-layer.patch": _final_aux_layer,
}


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
