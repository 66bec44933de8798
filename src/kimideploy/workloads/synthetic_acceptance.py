"""Synthetic acceptance for `run calibrate`: vLLM accepts draft tokens at a chosen rate.

vLLM 0.32's `rejection_sample_method: synthetic` runs the real draft and verify passes but accepts
position i with a fixed probability, so a load measures what speculation costs on a cluster at any
acceptance length without a trained drafter. vLLM fixes the rates when the engine is built; a
model load takes ~25 minutes, so one load per k has to measure every acceptance length.
`SyntheticAcceptanceControl` is a vLLM worker extension (`--worker-extension-cls`): its one
method, called through the dev-mode `/collective_rpc` endpoint of the calibration revision only,
writes new rates into the rejection sampler's rate tensor in place (same shape, same device, so
nothing recompiles and no CUDA graph is invalidated; sampling runs outside the graphs). The bench
workload calls it before each acceptance length and reads vLLM's own counters to check the
acceptance it got.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from kimideploy.formats.vllm_metrics import conditional_rates

RATE_ATTRIBUTE = "synthetic_conditional_rates"


def rates_for_length(length: float, k: int) -> list[float]:
    """Unconditional per-position rates with mean acceptance length `length` (= 1 + their sum)
    and the least variance: full positions, one fractional, then none (vLLM's own schedule for
    `synthetic_acceptance_length`, so a length set at start-up and one set later agree)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not 1.0 <= length <= k + 1:
        raise ValueError(f"acceptance length must be in [1, {k + 1}] for k={k}, got {length}")
    drafts = length - 1.0
    full = int(drafts)
    return ([1.0] * full + [drafts - full] + [0.0] * k)[:k]


def validate_rates(rates: list[float], k: int) -> list[float]:
    """vLLM's rules for `synthetic_acceptance_rates`: k entries in [0, 1], non-increasing."""
    if len(rates) != k:
        raise ValueError(f"expected {k} rates, got {len(rates)}: {rates}")
    if not all(0.0 <= r <= 1.0 for r in rates):
        raise ValueError(f"rates must be in [0, 1], got {rates}")
    if any(later > earlier for earlier, later in itertools.pairwise(rates)):
        raise ValueError(f"rates must be non-increasing, got {rates}")
    return [float(r) for r in rates]


class SyntheticAcceptanceControl:  # named in config/specs.py (SYNTHETIC_CONTROL_*)
    """Mixed into vLLM's worker class by `--worker-extension-cls`; no state of its own."""

    model_runner: Any

    def kimideploy_set_synthetic_acceptance(self, rates_json: str) -> dict[str, Any]:
        """Set the unconditional rates (a JSON list; the dev endpoint passes strings only)."""
        import torch

        tensors = [
            (name, getattr(part, RATE_ATTRIBUTE))
            for name, part in vars(self.model_runner).items()
            if isinstance(getattr(part, RATE_ATTRIBUTE, None), torch.Tensor)
        ]
        if not tensors:
            raise RuntimeError(
                "no synthetic rejection sampler in this worker: the revision must be served "
                "with rejection_sample_method 'synthetic'"
            )
        rates = json.loads(rates_json)
        for _, tensor in tensors:
            wanted = validate_rates(rates, int(tensor.numel()))
            tensor.copy_(torch.tensor(conditional_rates(wanted), dtype=tensor.dtype))
        return {"samplers": [name for name, _ in tensors], "rates": rates}
