"""Proof that each vLLM patch took effect, or that the pinned vLLM natively does what a patch did,
and that the runtime stage carries what GPU kernels need; run during the image build and by the
tests.

`python -m kimideploy.images.selfcheck CHECK...` imports the image's vLLM and checks the behaviour
each named patch (or `native-*` capability) promises; any failure exits non-zero, which fails the
docker build. `checks_for(image)` names the checks the build stage runs, `runtime_checks_for` the
ones the runtime stage runs (`c-toolchain`, `cuda-archs:sm_100,...`, `nccl`, `ibverbs`): what
Triton, NCCL and torch need at the first kernel, checked without a GPU before the image is pushed
instead of after a 25-minute load.
"""

from __future__ import annotations

import ctypes
import inspect
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from pathlib import Path

from kimideploy.config.images import SUFFIX_SELFCHECK
from kimideploy.formats.gpuinfo import uncovered


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


def _module_source(name: str) -> str:
    """A module's source, read without importing it (Model Runner V2 imports Triton, which a
    CPU build of vLLM lacks)."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin, f"{name} is missing"
    return Path(spec.origin).read_text()


def _speculation_switch() -> str:
    """Patch 0002: the engine core's switch sets the scheduler's flag, the scheduler schedules
    k = 0 while it is off and tells the workers, both runners skip the drafter, and the k = 0
    decode width is captured when KIMIDEPLOY_SPECULATION_SWITCH=1."""
    from types import SimpleNamespace

    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.spec_decode.dynamic import utils as dynamic

    assert SchedulerOutput.make_empty().speculation_paused is False, "no speculation_paused"
    scheduler = SimpleNamespace(num_spec_tokens=3, speculation_paused=False)
    scheduler.set_speculation_enabled = lambda enabled: Scheduler.set_speculation_enabled(
        scheduler,
        enabled,
    )
    core = SimpleNamespace(scheduler=scheduler)
    assert EngineCore.set_speculation_enabled(core, False) is False
    assert scheduler.speculation_paused, "switching off did not reach the scheduler"
    assert EngineCore.set_speculation_enabled(core, None) is False
    assert EngineCore.set_speculation_enabled(core, True) is True
    plain = SimpleNamespace(num_spec_tokens=0, speculation_paused=False)
    assert Scheduler.set_speculation_enabled(plain, True) is False
    schedule = inspect.getsource(Scheduler.schedule)
    assert "num_spec_tokens_to_schedule = 0" in schedule, "the scheduler still drafts while off"
    assert "speculation_paused=self.speculation_paused" in schedule
    runner_v1 = _module_source("vllm.v1.worker.gpu_model_runner")
    assert "if scheduler_output.speculation_paused:" in runner_v1, "V1 still drafts while off"
    runner_v2 = _module_source("vllm.v1.worker.gpu.model_runner")
    assert "speculation_paused=scheduler_output.speculation_paused" in runner_v2
    assert "if self.speculator is not None and speculation_paused:" in runner_v2
    graphs = _module_source("vllm.v1.worker.gpu.cudagraph_utils")
    config = _module_source("vllm.config.vllm")
    assert "speculation_switch_enabled()" in graphs and "speculation_switch_enabled()" in config
    saved = os.environ.get(dynamic.SPECULATION_SWITCH_ENV)
    try:
        os.environ[dynamic.SPECULATION_SWITCH_ENV] = "1"
        assert dynamic.speculation_switch_enabled()
        os.environ[dynamic.SPECULATION_SWITCH_ENV] = "0"
        assert not dynamic.speculation_switch_enabled()
    finally:
        if saved is None:
            os.environ.pop(dynamic.SPECULATION_SWITCH_ENV, None)
        else:
            os.environ[dynamic.SPECULATION_SWITCH_ENV] = saved
    return "speculation switches off and on in the engine core; both runners skip the drafter"


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
    "0002-speculation-switch.patch": _speculation_switch,
    SUFFIX_CHECK: _suffix_decoding,
}

NATIVE_FROM = (0, 32)
"""From vLLM 0.32 every patch kimideploy carried is upstream; these checks prove it per image."""
NATIVE_CHECKS = tuple(name for name in CHECKS if name.startswith("native-"))


C_PROBE = """#include <Python.h>
static struct PyModuleDef probe = {PyModuleDef_HEAD_INIT, "kimideploy_c_probe", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_kimideploy_c_probe(void) { return PyModule_Create(&probe); }
"""


def c_compiler() -> str | None:
    """The compiler Triton's launcher build picks: $CC, else gcc, else clang."""
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")


def python_include_dir() -> str:
    """Where Triton looks for Python.h (the default scheme's include path; Debian's
    'posix_local' scheme means 'posix_prefix' there too)."""
    scheme = sysconfig.get_default_scheme()
    if scheme == "posix_local":
        scheme = "posix_prefix"
    return sysconfig.get_paths(scheme=scheme)["include"]


def _c_toolchain() -> str:
    """Compile and import a C extension against this interpreter, the way Triton builds its
    CUDA launcher (`cuda_utils.c`, which includes Python.h) the first time a kernel runs."""
    cc = c_compiler()
    assert cc is not None, (
        "no C compiler (CC unset, no gcc or clang on PATH): Triton cannot build its launcher; "
        "install gcc in the runtime stage"
    )
    include = python_include_dir()
    assert (Path(include) / "Python.h").is_file(), (
        f"{include}/Python.h is missing: Triton's launcher cannot compile; install "
        f"python{sys.version_info.major}.{sys.version_info.minor}-dev in the runtime stage"
    )
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    with tempfile.TemporaryDirectory() as work:
        source, library = Path(work) / "probe.c", Path(work) / f"kimideploy_c_probe{suffix}"
        source.write_text(C_PROBE)
        command = [cc, str(source), "-O3", "-shared", "-fPIC", "-I", include, "-o", str(library)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{cc} failed: {done.stderr.strip()[-500:]}"
        sys.path.insert(0, work)
        try:
            __import__("kimideploy_c_probe")
        finally:
            sys.path.remove(work)
            sys.modules.pop("kimideploy_c_probe", None)
    return f"{cc} compiles and links a C extension against {include}/Python.h"


def torch_arch_flags() -> list[str]:
    """The architectures torch's CUDA kernels were compiled for, read without a GPU (what
    `torch.cuda.get_arch_list()` returns on a machine that has one)."""
    import torch

    archs: list[str] = torch.cuda.get_arch_list()
    return archs


def _cuda_archs(claimed: str) -> str:
    archs = [a for a in claimed.split(",") if a]
    compiled = torch_arch_flags()
    assert compiled, "this torch has no CUDA kernels (a CPU build)"
    missing = uncovered(archs, compiled)
    assert not missing, (
        f"torch's kernels are compiled for {' '.join(compiled)}: nothing runs on "
        f"{', '.join(missing)}, which this image claims"
    )
    return f"torch's kernels ({' '.join(compiled)}) run on every claimed {', '.join(archs)}"


def _nccl() -> str:
    import torch
    import torch.cuda.nccl

    assert torch.version.cuda, "this torch has no CUDA (a CPU build)"
    version = ".".join(str(part) for part in torch.cuda.nccl.version())
    return f"NCCL {version} loads (torch {torch.__version__}, CUDA {torch.version.cuda})"


IBVERBS_LIBRARY = "libibverbs.so.1"


def _ibverbs() -> str:
    """NCCL dlopens the verbs library at its first InfiniBand use; without it NCCL silently
    all-reduces over TCP sockets."""
    try:
        ctypes.CDLL(IBVERBS_LIBRARY)
    except OSError as exc:
        raise AssertionError(
            f"{IBVERBS_LIBRARY} does not load ({exc}): NCCL would fall back to TCP sockets; "
            "install libibverbs1 and ibverbs-providers in the runtime stage"
        ) from exc
    return f"{IBVERBS_LIBRARY} loads (NCCL's InfiniBand transport can start)"


def _flashinfer_cubins() -> str:
    """FlashInfer reads the cubins baked into the image (FLASHINFER_CUBIN_DIR), so no pod
    downloads them at its first call."""
    wanted = os.environ.get("FLASHINFER_CUBIN_DIR")
    assert wanted, "FLASHINFER_CUBIN_DIR is not set: FlashInfer would download cubins in the pod"
    from flashinfer.jit import env as flashinfer_env

    used = Path(flashinfer_env.FLASHINFER_CUBIN_DIR)
    assert used == Path(wanted), f"FlashInfer reads cubins from {used}, not {wanted}"
    cubins = sum(1 for _ in used.rglob("*.cubin"))
    assert cubins, f"{used} holds no cubins: `python -m flashinfer --download-cubin` did not run"
    from vllm.utils import flashinfer as vllm_flashinfer

    assert vllm_flashinfer.has_flashinfer_cubin(), (
        "vLLM does not count the baked cubins (VLLM_HAS_FLASHINFER_CUBIN unset): it would ask "
        "NVIDIA's artifact server for TRT-LLM attention in every pod"
    )
    return f"FlashInfer reads {cubins} baked-in cubins from {used}, and vLLM counts them"


RUNTIME_CHECKS: dict[str, Callable[[], str]] = {
    "c-toolchain": _c_toolchain,
    "nccl": _nccl,
    "ibverbs": _ibverbs,
    "flashinfer-cubins": _flashinfer_cubins,
}
PARAMETER_CHECKS: dict[str, Callable[[str], str]] = {"cuda-archs": _cuda_archs}


def runtime_checks_for(cuda: str | None, cuda_archs: list[str], flashinfer: bool) -> list[str]:
    """What the runtime stage of a CUDA image proves before it is pushed (a CPU image has no
    GPU kernels to compile); a vLLM image also its baked-in FlashInfer cubins."""
    if cuda is None:
        return []
    checks = ["c-toolchain", f"cuda-archs:{','.join(cuda_archs)}", "nccl", "ibverbs"]
    return [*checks, *(["flashinfer-cubins"] if flashinfer else [])]


def checks_for(vllm: str | None, patches: list[str], suffix: bool = False) -> list[str]:
    """The self-checks an image runs: its patches', the native ones from vLLM 0.32 on, and
    suffix decoding's where the image carries Arctic Inference."""
    if vllm is None:
        return list(patches)
    major, minor = (int(part) for part in vllm.split(".")[:2])
    native = NATIVE_CHECKS if (major, minor) >= NATIVE_FROM else ()
    return [*patches, *native, *((SUFFIX_CHECK,) if suffix else ())]


def _lookup(name: str) -> Callable[[], str] | None:
    if name in CHECKS:
        return CHECKS[name]
    if name in RUNTIME_CHECKS:
        return RUNTIME_CHECKS[name]
    head, _, value = name.partition(":")
    parameterised = PARAMETER_CHECKS.get(head)
    return (lambda: parameterised(value)) if parameterised else None


def run(patches: list[str]) -> list[tuple[str, bool, str]]:
    """(check, ok, message) for each named check; an unknown name is a failure (no silent pass)."""
    results = []
    for name in patches:
        check = _lookup(name)
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
