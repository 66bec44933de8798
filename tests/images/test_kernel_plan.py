"""The kernel plan is vLLM's own selection code evaluated on CPU, not a table we keep.

Each image's plan is derived again from its pinned (and patched) sources and compared with the
stored docker/kernel-plans.json; then one line of those sources is changed, as an upstream
release or a patch would change it, and the derived plan follows it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from kimideploy.config.loading import LoadedProject
from kimideploy.config.project import Project
from kimideploy.images import kernel_derive
from kimideploy.images import verify as checks
from kimideploy.images.cpu_vllm import engine_python
from kimideploy.plan.kernel_plan import KernelPlan, plan_of, stored_all, stored_plan

TRITON_MLA = "vllm/v1/attention/backends/mla/triton_mla.py"


PRISTINE: dict[str, dict] = {}
"""Each image's derivation from its own sources, once per session (one vLLM import per arch)."""


def derived_plan(example: LoadedProject, name: str, overlay: Path | None = None) -> dict:
    """`overlay` None: the image's own (patched) sources."""
    if overlay is None and name in PRISTINE:
        return PRISTINE[name]
    image = example.project.images[name]
    assert image.vllm is not None
    python = engine_python(image.vllm)
    derived = kernel_derive.derive(
        example.project,
        name,
        python,
        overlay or (checks.patched_overlay(image, python) if image.patches else None),
    )
    if overlay is None:
        PRISTINE[name] = derived
    return derived


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


def asked_on(example: LoadedProject, spec_changes: dict, project: Project | None = None) -> dict:
    """kernel_check.py's whole answer for 0.32 on sm_100 alone (one architecture: seconds)."""
    spec = {
        **kernel_derive.check_spec(project or example.project, "vllm-0.32-kimi"),
        "archs": ["sm_100"],
        **spec_changes,
    }
    key = json.dumps(spec, sort_keys=True)
    if key not in ASKED:
        image = example.project.images["vllm-0.32-kimi"]
        python = engine_python("0.32.0")
        ASKED[key] = kernel_derive.run_check(spec, python, checks.patched_overlay(image, python))
    return ASKED[key]


ASKED: dict[str, dict] = {}


def with_qk_nope(project: Project, width: int) -> Project:
    model = project.model
    assert model.attention is not None
    attention = model.attention.model_copy(update={"qk_nope_head_dim": width})
    return project.model_copy(update={"model": model.model_copy(update={"attention": attention})})


def test_a_refusal_that_reads_the_model_is_evaluated_with_its_config(
    example: LoadedProject,
) -> None:
    """FlashInfer-MLA refuses a qk_nope_head_dim outside 64/128/192, reading the model's config:
    under an empty VllmConfig it never refused. Kimi-K2.5's 128 takes it on sm_100; a model with
    96 is planned onto the next backend, and the stored plan (derived for 128) is not used."""
    kimi = asked_on(example, {})
    assert kimi["evaluated_with"].startswith("the model's and drafters' config.json")
    assert kimi["archs"]["sm_100"]["target"]["selected"]["backend"] == "FLASHINFER_MLA"

    other = with_qk_nope(example.project, 96)
    refused = asked_on(example, {}, other)["archs"]["sm_100"]["target"]
    first = refused["candidates"][0]
    assert first["backend"] == "FLASHINFER_MLA"
    assert any("qk_nope_head_dim" in reason for reason in first["reasons"]), first
    assert refused["selected"]["backend"] != "FLASHINFER_MLA"

    assert stored_plan(example.project, "vllm-0.32-kimi", "sm_100") is not None
    assert stored_plan(other, "vllm-0.32-kimi", "sm_100") is None


def test_the_drafters_backend_is_decided_on_the_nvl8_gpus(example: LoadedProject) -> None:
    """The drafter's backend on sm_100 was undetermined (FlashInfer a stand-in the selection
    could not import); under the drafter's config it is decided, and its CUDA graphs follow
    whether the image bakes the TRT-LLM cubins (without them vLLM would ask NVIDIA's server)."""
    baked = asked_on(example, {})["archs"]["sm_100"]["drafter"]
    assert baked["selected"]["backend"] == "FLASHINFER" and baked["undetermined_ahead"] == []
    assert baked["selected"]["cudagraph_support"] == "UNIFORM_BATCH"
    missing = asked_on(example, {"flashinfer_cubins": False})["archs"]["sm_100"]["drafter"]
    assert missing["selected"]["cudagraph_support"] == "UNIFORM_SINGLE_TOKEN_DECODE"
    stored = stored_plan(example.project, "vllm-0.32-kimi", "sm_100")
    assert stored is not None and stored.drafter is not None
    assert stored.drafter.backend == "FLASHINFER" and not stored.drafter.undetermined_ahead
