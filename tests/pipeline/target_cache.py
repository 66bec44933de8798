"""The informative test target, built once per version and kept under
~/.cache/kimideploy/pipeline-target/<key>/ (served/ and previous/, see make_target.py).

The key covers everything the weights depend on: make_target.py, stdlib_corpus.py, both chat
templates, the training settings, the interpreter version (its standard library is the corpus)
and the CPU venv (torch's version). A build goes to a temporary folder renamed in when complete,
under a lock, so two test runs never build it twice or read half of it.

`python tests/pipeline/target_cache.py` builds it ahead (scripts/test does, while the network-bound
installs run), and prints where it is.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE.parent / "fixtures" / "chat_templates"
STEPS = {"steps_previous": 600, "steps": 300, "seed": 0}
SAME_ON_ANY_CPU = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
                   "ONEDNN_MAX_CPU_ISA": "SSE41"}  # fmt: skip
"""The build's arithmetic made independent of the CPU it runs on. The weights came out otherwise
on an AMD and an Intel machine with the same sources and seed: ATen's kernels are compiled per
instruction set (AVX-512, AVX2, none) and dispatched by the CPU, and each sums in its own order.
`default` forces the portable ones; MKL's conditional-reproducibility mode and oneDNN's ISA cap
pin the libraries the same way. Measured on this tier's machine (bench/MEASUREMENTS.md): the
served weights' sha256 was the same with one thread and two, with AVX2, FMA and AVX-512 masked
from glibc, with MKL limited to SSE4.2 and with oneDNN unlimited, and differed under
ATEN_CPU_CAPABILITY avx512 vs avx2 vs default without this. It costs ~2.4x the build's time.
Not enough across vendors: on 2026-12-05 an Intel Xeon with AMX and AVX-512 FP16 built served
weights of sha256 7332a96d... where the AMD EPYC built 2fa64e37... (bench/MEASUREMENTS.md), so
the tier's assertions carry margins for the build's machine, and the figures it prints name it."""
SOURCES = (HERE / "make_target.py", HERE / "stdlib_corpus.py",
           TEMPLATES / "kimi_shaped.jinja", TEMPLATES / "kimi_k2_shaped.jinja")  # fmt: skip


def cache_dir() -> Path:
    root = Path(os.environ.get("KIMIDEPLOY_CACHE", Path.home() / ".cache" / "kimideploy"))
    return root / "pipeline-target"


def key(python: Path) -> str:
    digest = hashlib.sha256(json.dumps([STEPS, SAME_ON_ANY_CPU], sort_keys=True).encode())
    for source in SOURCES:
        digest.update(source.read_bytes())
    digest.update(f"{platform.python_version()} {python.resolve().parent.parent.name}".encode())
    return digest.hexdigest()[:16]


def informative_target(python: Path, env: dict[str, str]) -> Path:
    """The folder holding served/ and previous/, built with `python` (the CPU vLLM venv's) when
    missing. Returns quickly when it is there."""
    root = cache_dir() / key(python)
    if (root / "built.json").is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with (root.parent / f"{root.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run may be building it right now
        if (root / "built.json").is_file():
            return root
        partial = root.parent / f".{root.name}.tmp-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        started = time.monotonic()
        args = [f"--steps-previous={STEPS['steps_previous']}", f"--steps={STEPS['steps']}",
                f"--seed={STEPS['seed']}"]  # fmt: skip
        done = subprocess.run([str(python), str(HERE / "make_target.py"), str(partial), *args],
                              capture_output=True, text=True, timeout=3600,
                              env={**env, **SAME_ON_ANY_CPU})  # fmt: skip
        if done.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            raise RuntimeError(f"building the test target failed:\n{done.stderr[-3000:]}")
        record = json.loads(done.stdout.strip().splitlines()[-1])
        record["build_seconds"] = round(time.monotonic() - started, 1)
        record["weights_sha256"] = {
            name: hashlib.sha256((partial / name / "model.safetensors").read_bytes()).hexdigest()
            for name in ("previous", "served")
        }
        (partial / "built.json").write_text(json.dumps(record, indent=2))
        shutil.rmtree(root, ignore_errors=True)
        partial.rename(root)
    return root


def main() -> int:
    sys.path.insert(0, str(HERE.parents[1] / "src"))
    from kimideploy.images.cpu_vllm import cpu_runtime_env, cpu_vllm_python

    python = cpu_vllm_python()
    root = informative_target(python, {**os.environ, **cpu_runtime_env(python.parent.parent)})
    print(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
