"""The kernel plan: which attention kernels an image's pinned vLLM takes on each GPU it claims, and
whether a speculative verification runs on the decode path there.

Derived, not tabled: `kimideploy image kernels NAME --write` runs images/kernel_check.py with the
image's own vLLM (its patched sources first) and stores the answer in docker/kernel-plans.json,
with the vLLM version and patches it was derived from; `image verify` derives it again and fails
when the pinned sources now select otherwise. Plans read the stored answer here (no vLLM on the
operator's machine); an entry of another vLLM or patch set is not used.

The speculation verdict: a (k+1)-token verification takes the chosen MLA backend's decode path when
its metadata builder accepts uniform or variable query lengths; SINGLE_ONLY sends it through
MLA's prefill over the whole context, every step, where speculation cannot pay.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from kimideploy.config.project import Project
from kimideploy.paths import repository_root
from kimideploy.plan.kernel_inputs import model_fingerprint

KERNEL_PLANS = Path("docker") / "kernel-plans.json"
DECODE_QUERY_LENGTHS = {"UNIFORM", "VARLEN"}


@dataclass(frozen=True)
class KernelChoice:
    backend: str | None
    query_len_support: str | None
    cudagraph_support: str | None
    undetermined_ahead: tuple[str, ...]
    """Backends vLLM would try first whose validation needs the device: on the GPU one of them
    may be taken instead."""

    @property
    def verifies_on_decode(self) -> bool | None:
        if self.backend is None or self.query_len_support is None:
            return None
        return self.query_len_support in DECODE_QUERY_LENGTHS

    def describe(self) -> str:
        graphs = f", CUDA graphs {self.cudagraph_support.lower()}" if self.cudagraph_support else ""
        text = f"{self.backend}{graphs}"
        if self.backend in self.undetermined_ahead:  # the choice itself cannot be checked on CPU
            return f"{text} (not decidable on CPU: its kernels are the image's FlashInfer's)"
        if self.undetermined_ahead:
            text = f"{' or '.join(self.undetermined_ahead)} (not decidable on CPU), else {text}"
        return text


@dataclass(frozen=True)
class KernelPlan:
    image: str
    vllm: str
    arch: str
    target: KernelChoice
    drafter: KernelChoice | None
    experts: dict[str, KernelChoice] = field(default_factory=dict)
    """The routed experts' kernel per checkpoint format (int4, nvfp4): vLLM's MoE oracle,
    about half of a decode step's cost."""

    @property
    def speculation_can_pay(self) -> bool | None:
        return self.target.verifies_on_decode

    def verification(self) -> str:
        decode = self.target.verifies_on_decode
        support = self.target.query_len_support
        if decode is None:
            return "undetermined (no MLA backend decided on CPU)"
        if decode:
            return f"decode path ({self.target.backend} takes {str(support).lower()} query lengths)"
        return (
            f"PREFILL path: {self.target.backend}'s decode pipeline takes single-token queries "
            f"only ({support}), so each (k+1)-token verification re-runs MLA prefill over the "
            "whole context"
        )

    def experts_kernel(self, quantization: str, moe_backend: str = "auto") -> str | None:
        """The experts' kernel of a checkpoint format, as configured or as vLLM picks it."""
        if moe_backend != "auto":
            return f"{moe_backend.upper()} (serve.moe_backend)"
        found = self.experts.get(quantization)
        return found.describe() if found is not None and found.backend else None

    def describe(
        self, quantization: str | None = None, moe_backend: str = "auto", speculative: bool = True
    ) -> str:
        """The kernels of a serve engine; without a drafter (`speculative` False) the target's
        only: a drafter's kernel and the verification path are not part of that engine."""
        lines = f"vLLM {self.vllm} on {self.arch}: target {self.target.describe()}"
        experts = self.experts_kernel(quantization, moe_backend) if quantization else None
        if experts:
            lines += f", {quantization} experts {experts}"
        if not speculative:
            return lines
        if self.drafter is not None:
            lines += f"; drafter {self.drafter.describe()}"
        return f"{lines}; verification on the {self.verification()}"


def plans_file() -> Path:
    return repository_root() / KERNEL_PLANS


def stored_all() -> dict[str, Any]:
    return dict(_read(plans_file()))


@cache
def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    stored: dict[str, Any] = json.loads(path.read_text())
    return stored


def forget_stored() -> None:
    """After `image kernels --write` changed the file in this process."""
    _read.cache_clear()


def _choice(raw: dict[str, Any]) -> KernelChoice:
    return KernelChoice(
        raw.get("backend"),
        raw.get("query_len_support"),
        raw.get("cudagraph_support"),
        tuple(raw.get("undetermined_ahead") or ()),
    )


def stored_plan(project: Project, image_name: str, arch: str) -> KernelPlan | None:
    """The stored plan of an image on an architecture, or None (no vLLM, none derived yet, or
    derived from another vLLM or patch set than the image now pins, or for another model's
    config.json than the project declares)."""
    image = project.images[image_name]
    entry = stored_all().get(image_name)
    if image.vllm is None or entry is None or entry.get("vllm") != image.vllm:
        return None
    if entry.get("patches") != list(image.patches):
        return None
    if entry.get("model") != model_fingerprint(project):
        return None
    per_engine = entry.get("archs", {}).get(arch)
    if per_engine is None or "target" not in per_engine:
        return None
    return plan_of(image_name, image.vllm, arch, per_engine)


def plan_of(image_name: str, vllm: str, arch: str, per_engine: dict[str, Any]) -> KernelPlan:
    """One architecture's entry of a derived or stored plan."""
    drafter = per_engine.get("drafter")
    experts = {
        name.removeprefix("moe-"): _choice(raw.get("selected") or raw)
        for name, raw in per_engine.items()
        if name.startswith("moe-")
    }
    return KernelPlan(
        image_name,
        vllm,
        arch,
        _choice(per_engine["target"]),
        _choice(drafter) if drafter else None,
        experts,
    )
