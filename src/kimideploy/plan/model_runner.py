"""Which vLLM model runner an engine pod runs: pinned with VLLM_USE_V2_MODEL_RUNNER, never left to
the engine's default.

The runner decides where an EAGLE-3 drafter's aux layer ids are read (formats/drafter_files.py),
which acceptance a drafter reaches (vllm#40551: an acceptance bug under V2, open), and how hidden
states are extracted. vLLM 0.32 (config/vllm.py `use_v2_model_runner`) runs V2 unless the variable
says otherwise, Triton is missing, or a feature V2 lacks is asked for (suffix decoding among
them), and says so only in a log line; before 0.32 the variable defaults to V1. A default that
moves with the engine moves a promoted drafter's acceptance with it, so every engine pod sets the
variable, the plan shows it and the release record keeps it (in the pod's env).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kimideploy.config.images import Image
from kimideploy.errors import ConfigError
from kimideploy.formats.extraction_engine import version_tuple
from kimideploy.plan import online, replay
from kimideploy.plan.inputs import PlanInputs

RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
V2_DEFAULT_FROM = (0, 32)
"""The first vLLM whose engine picks Model Runner V2 by default (for EAGLE-3 and extraction)."""
V2_UNSUPPORTED_METHODS = frozenset({"suffix"})
"""kimideploy's speculative methods vLLM 0.32's V2 runner refuses (it falls back to V1 for
suffix, medusa, mlp_speculator and custom classes)."""

Runner = Literal["v1", "v2"]


@dataclass(frozen=True)
class ModelRunner:
    runner: Runner
    why: str

    def env(self) -> dict[str, str]:
        return {RUNNER_ENV: "1" if self.runner == "v2" else "0"}

    def describe(self) -> str:
        return f"{self.runner} ({RUNNER_ENV}={self.env()[RUNNER_ENV]}: {self.why})"


def pinned(image: Image, image_name: str, method: str | None = None) -> ModelRunner:
    """The runner `image_name`'s engine pods run for `method` (the speculative method served, or
    None): the image's `model_runner`, else the engine's own default for that method, written
    down. A V2 image asked to serve a method V2 does not run is a configuration error."""
    unsupported = method in V2_UNSUPPORTED_METHODS
    if image.model_runner == "v2" and unsupported:
        raise ConfigError(
            f"images.{image_name}.model_runner is v2, but vLLM's Model Runner V2 does not run "
            f"the {method} method (vLLM 0.32 falls back to V1 for it)",
            hint=f"unset images.{image_name}.model_runner or set it to v1 to serve {method}",
        )
    if image.model_runner is not None:
        return ModelRunner(image.model_runner, f"images.{image_name}.model_runner")
    if unsupported:
        return ModelRunner("v1", f"Model Runner V2 does not run {method}")
    if image.vllm is not None and version_tuple(image.vllm) >= V2_DEFAULT_FROM:
        return ModelRunner("v2", f"vLLM {image.vllm}'s default, pinned")
    return ModelRunner("v1", f"vLLM {image.vllm}'s default, pinned")


def served(ctx: PlanInputs) -> ModelRunner | None:
    """The serve release's runner (None: its image has no vLLM)."""
    if ctx.image.vllm is None:
        return None
    method = ctx.model_free.method if ctx.model_free is not None else None
    return pinned(ctx.image, ctx.image_name, method)


def plan_fact(ctx: PlanInputs) -> str | None:
    """What the plan shows: the runner of each engine the workload's pods start."""
    engines = engine_runners(ctx)
    return "; ".join(f"{what}: {r.describe()}" for what, r in engines) or None


def engine_runners(ctx: PlanInputs) -> list[tuple[str, ModelRunner]]:
    """Each engine the workload's pods start, as the plan names it, with its runner."""
    engines: list[tuple[str, ModelRunner]] = []
    if ctx.kind.release:
        runner = served(ctx)
        engines += [("serve", runner)] if runner is not None else []
    elif ctx.kind.engine is not None:
        name, image = engine_image(ctx)
        if image.vllm is not None:
            engines.append((ctx.kind.engine, pinned(image, name)))
    if online.is_online(ctx):
        name = ctx.cluster.images.extract
        engines.append(("target server", pinned(ctx.project.images[name], name)))
    return engines


def engine_image(ctx: PlanInputs) -> tuple[str, Image]:
    """The image whose vLLM the workload's engine runs: the replay captures on its own choice."""
    if ctx.kind.pulls == "replayed":
        name, image, _ = replay.capture_image(ctx)
        return name, image
    return ctx.image_name, ctx.image
