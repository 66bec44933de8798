"""The learning-rate schedule of a training run: linear warmup, then linear or cosine decay to
`min_lr_ratio * lr` at the last step (speculators 0.9 and SpecForge schedule the same way; a
constant rate was what this workload did before, and stays available).

The factor is a pure function of the step, so a resumed run that restores the scheduler's state
(its step count) continues on exactly the same curve.
"""

from __future__ import annotations

import math
from typing import Any

from kimideploy.config.specs import TrainSpec


def lr_factor(step: int, total: int, spec: TrainSpec) -> float:
    """The learning rate at `step` (0-based, before the step is taken), relative to spec.lr."""
    warmup = int(total * spec.warmup_ratio)
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if spec.lr_schedule == "constant":
        return 1.0
    progress = min(max(step - warmup, 0) / max(total - warmup - 1, 1), 1.0)
    floor = spec.min_lr_ratio
    if spec.lr_schedule == "linear":
        return floor + (1 - floor) * (1 - progress)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: Any, total: int, spec: TrainSpec) -> Any:
    import torch

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, total, spec))
