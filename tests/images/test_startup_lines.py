"""The start-up phase table reads the lines the pinned vLLM prints: each format string is found in
the official 0.32.0 wheel's sources (what the serve image runs), rendered with sample values the
way vLLM's logger renders it, and recognised by formats/startup_phases.py. A vLLM that rewords
one of them fails here, before a phase silently drops out of every table."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kimideploy.formats.startup_phases import in_progress, parse
from kimideploy.images import verify

VERSION = "0.32.0"
LINES = (
    # (source file, the format string as written there, sample arguments, the phase it starts)
    ("vllm/v1/worker/gpu_model_runner.py", '"Starting to load model %s..."', ("/m",),
     "weights read"),
    ("vllm/v1/worker/cpu_model_runner.py", '"Starting to load model %s..."', ("/m",),
     "weights read"),
    ("vllm/model_executor/model_loader/default_loader.py", '"Loading weights took %.2f seconds"',
     (12.5,), "weight processing"),
    ("vllm/v1/worker/gpu_model_runner.py",
     '"Model loading took %s GiB memory and %.6f seconds"', ("74.1", 139.5),
     "profiling and KV cache"),
    ("vllm/v1/worker/gpu/model_runner.py",
     '"Model loading took %s GiB memory and %.6f seconds"', ("74.1", 139.5),
     "profiling and KV cache"),
    ("vllm/compilation/monitor.py", '"%sStarting torch.compile"', ("",), "torch.compile"),
    ("vllm/compilation/monitor.py", '"%storch.compile took %.2f s in total"', ("", 61.9),
     "profiling and KV cache"),
    ("vllm/v1/worker/gpu_model_runner.py", '"Graph capturing finished in %.0f secs, took %.2f GiB"',
     (34, 1.87), "profiling and KV cache"),
    ("vllm/v1/worker/gpu/model_runner.py", '"Graph capturing finished in %.0f secs, took %.2f GiB"',
     (34, 1.87), "profiling and KV cache"),
    ("vllm/v1/engine/core.py",
     '"init engine (profile, create kv cache, warmup model) took %.2f s",', (131.2,),
     "API server ready"),
    ("vllm/entrypoints/launchers/api_server/entry.py", '"Starting vLLM server on %s"',
     ("http://0.0.0.0:8000",), "API server ready"),
)  # fmt: skip
SPLIT_LINES = (
    # Written over two string literals in the source: both halves must be there.
    ("vllm/compilation/backends.py", ('"%sDirectly load the compiled graph(s) for compile "',
     '"range %s from the cache, took %.3f s"'), ("", "(1, 8192)", 4.5), "torch.compile"),
    ("vllm/compilation/backends.py", ('"%sCompiling a graph for compile range %s takes %.2f s"',),
     ("", "(1, 8192)", 23.4), "torch.compile"),
)  # fmt: skip


@pytest.fixture(scope="module")
def sources() -> Path:
    try:
        return verify.vllm_sources(VERSION)
    except RuntimeError as exc:
        if os.environ.get("KIMIDEPLOY_REQUIRE_PIPELINE") == "1":
            pytest.fail(f"the vLLM {VERSION} wheel could not be had: {exc}")
        pytest.skip(f"the vLLM {VERSION} wheel could not be had: {exc}")


def _logged(message: str) -> str:
    """A line as vLLM's default formatter writes it (vllm/logger.py _FORMAT)."""
    return f"(Worker_TP0 pid=120) INFO 12-07 10:00:41 [x.py:1] {message}"


@pytest.mark.parametrize(("where", "written", "values", "phase"), LINES)
def test_each_line_the_table_reads_is_printed_by_the_pinned_vllm(
    sources: Path, where: str, written: str, values: tuple[object, ...], phase: str
) -> None:
    assert written in (sources / where).read_text(), f"{where} no longer prints {written}"
    template = written.rstrip(",").strip('"')
    assert in_progress([_logged(template % values)]) == phase


@pytest.mark.parametrize(("where", "parts", "values", "phase"), SPLIT_LINES)
def test_the_compile_cache_lines_are_printed_by_the_pinned_vllm(
    sources: Path, where: str, parts: tuple[str, ...], values: tuple[object, ...], phase: str
) -> None:
    text = (sources / where).read_text()
    assert all(part in text for part in parts), f"{where} no longer prints {parts}"
    message = "".join(part.strip('"') for part in parts) % values
    assert in_progress([_logged(message)]) == phase
    cache = parse([_logged(message)]).compile_cache
    assert cache == ("warm" if "Directly load" in message else "cold")
