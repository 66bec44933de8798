"""The kernel plan is vLLM's own selection code evaluated on CPU, not a table we keep.

Each image's plan is derived again from its pinned (and patched) sources and compared with the
stored docker/kernel-plans.json; then one line of those sources is changed, as an upstream
release or a patch would change it, and the derived plan follows it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kimideploy.config.loading import LoadedProject
from kimideploy.images import kernel_derive
from kimideploy.images import verify as checks
from kimideploy.images.cpu_vllm import engine_python
from kimideploy.plan.kernel_plan import KernelPlan, plan_of, stored_all

TRITON_MLA = "vllm/v1/attention/backends/mla/triton_mla.py"


def derived_plan(example: LoadedProject, name: str, overlay: Path | None = None) -> dict:
    image = example.project.images[name]
    assert image.vllm is not None
    python = engine_python(image.vllm)
    if overlay is None and image.patches:
        overlay = checks.patched_overlay(image, python)
    return kernel_derive.derive(example.project, name, python, overlay)


def on_the_host(name: str, derived: dict) -> KernelPlan:
    return plan_of(name, derived["vllm"], "sm_120", derived["archs"]["sm_120"])


@pytest.mark.parametrize("name", ["vllm-0.16-kimi", "vllm-0.32-kimi"])
def test_the_stored_plan_is_what_the_pinned_sources_select(
    example: LoadedProject, name: str
) -> None:
    image = example.project.images[name]
    derived = derived_plan(example, name)
    assert kernel_derive.is_stored(name, image, derived), (
        f"stale: `kimideploy image kernels {name} --write`"
    )
    assert stored_all()[name]["patches"] == list(image.patches)


def test_the_verdict_on_the_pcie_host_is_the_sources_verdict(example: LoadedProject) -> None:
    """0.16's Triton MLA takes single-token queries only (prefill-path verification: cannot pay);
    0.32's takes uniform ones on the decode path."""
    old = on_the_host("vllm-0.16-kimi", derived_plan(example, "vllm-0.16-kimi"))
    new = on_the_host("vllm-0.32-kimi", derived_plan(example, "vllm-0.32-kimi"))
    assert old.target.backend == new.target.backend == "TRITON_MLA"
    assert (old.target.query_len_support, old.speculation_can_pay) == ("SINGLE_ONLY", False)
    assert (new.target.query_len_support, new.speculation_can_pay) == ("UNIFORM", True)


def test_the_plan_changes_when_the_sources_change(example: LoadedProject, tmp_path: Path) -> None:
    """Triton MLA's builder edited back to single-token queries in 0.32's patched sources: the
    derived plan for sm_120 says prefill-path verification; the NVL8 GPUs' does not move."""
    image = example.project.images["vllm-0.32-kimi"]
    python = engine_python("0.32.0")
    patched = checks.patched_overlay(image, python)
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    # Hard links, like the patched overlay: the file edited is replaced, never written through.
    subprocess.run(["cp", "-al", str(patched / "vllm"), str(overlay / "vllm")], check=True)
    source = overlay / TRITON_MLA
    text = source.read_text()
    declared = "query_len_support: ClassVar[QueryLenSupport] = QueryLenSupport.UNIFORM"
    assert text.count(declared) == 1, "triton_mla.py no longer declares what this test edits"
    source.unlink()
    source.write_text(text.replace(declared, declared.replace("UNIFORM", "SINGLE_ONLY")))
    shutil.rmtree(overlay / "vllm" / "v1" / "attention" / "backends" / "mla" / "__pycache__",
                  ignore_errors=True)  # fmt: skip
    edited = derived_plan(example, "vllm-0.32-kimi", overlay)
    pristine = derived_plan(example, "vllm-0.32-kimi")
    host = on_the_host("vllm-0.32-kimi", edited)
    assert host.target.query_len_support == "SINGLE_ONLY" and host.speculation_can_pay is False
    assert edited["archs"]["sm_100"] == pristine["archs"]["sm_100"]
    assert (patched / TRITON_MLA).read_text() == text  # the shared overlay is untouched
