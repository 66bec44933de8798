"""The train workload in fp32 and in bf16 autocast, side by side on the same features, and a bf16
base drafter fine-tuned: step time, loss and held-out figures of each, printed.

    python bench/train_precision.py [--gpu-shape] [--steps N] [--out DIR]

Everything runs through the pipeline's own pod entry points on a DeepSeek-V3-shaped target made
here (random weights, MLA attention, a few MoE layers; a byte-level tokenizer with Kimi's chat
tokens): conversations in datagen's format, `extract` with the reference backend (transformers),
`vocab`, then `train` twice with the same seed, data order and steps, and once more from the bf16
copy of the first drafter. `--gpu-shape` gives the target Kimi-K2.5's width (hidden 7168, 64
heads, vocabulary 163,840): the drafter then has Kimi's shape (one decoder layer, fc 3 x 7168,
draft vocabulary 32,000), as on the clusters; without it the shapes are small enough for a CPU.

With random target weights the held-out acceptance says nothing about a drafter's quality; what
it shows is that bf16 and fp32 judge alike. On a GPU the step time is the figure that matters
(scripts/gpu-smoke runs this). Run with the CPU vLLM venv's python (or the GPU machine's).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO))

from kimideploy.config.specs import (  # noqa: E402
    ExtractSpec,
    LayerSelection,
    TargetRef,
    TrainSpec,
    VocabSpec,
)
from kimideploy.formats.chat_template import SAMPLE_FORMAT  # noqa: E402
from kimideploy.workloads import dataset_record  # noqa: E402

SENTENCE = (
    "speculative decoding drafts tokens that the target verifies in one pass while the "
    "drafter reads hidden states of three layers and predicts the next token"
)
WORDS = SENTENCE.split()


def shapes(gpu: bool) -> dict[str, int]:
    if gpu:
        return {
            "hidden": 7168,
            "heads": 64,
            "vocab": 163840,
            "draft_vocab": 32000,
            "layers": 4,
            "samples": 64,
            "words": 400,
        }
    return {
        "hidden": 256,
        "heads": 4,
        "vocab": 4096,
        "draft_vocab": 256,
        "layers": 4,
        "samples": 48,
        "words": 120,
    }


MAKE_TARGET = """
import sys, torch
from pathlib import Path
from tests.workloads.make_tiny_model import main as tokenizer_and_llama
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, PreTrainedTokenizerFast
out, hidden, heads, vocab, layers = Path(sys.argv[1]), *map(int, sys.argv[2:6])
tokenizer_and_llama(out, 1)  # the tokenizer with Kimi's chat tokens (the Llama is replaced)
tokenizer = PreTrainedTokenizerFast.from_pretrained(out)
config = DeepseekV3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
    moe_intermediate_size=hidden // 4, num_hidden_layers=layers, first_k_dense_replace=1,
    n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
    num_attention_heads=heads, num_key_value_heads=heads, kv_lora_rank=hidden // 14,
    q_lora_rank=hidden // 5, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
    max_position_embeddings=4096, eos_token_id=tokenizer.eos_token_id,
    pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
torch.manual_seed(0)
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
    model = DeepseekV3ForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(out)
"""


def python_path() -> str:
    """This repository's sources first, then whatever the caller had (carried wheels)."""
    inherited = os.environ.get("PYTHONPATH")
    return ":".join([str(REPO / "src"), str(REPO), *([inherited] if inherited else [])])


class WorkloadFailedError(RuntimeError):
    pass


def run(python: str, workload: str, spec: Any, where: Path) -> tuple[float, list[dict[str, Any]]]:
    """The pod entry point on a spec; (seconds, its JSON events)."""
    path = where / f"{workload}-{spec.run_id}.json"
    path.write_text(spec.model_dump_json())
    env = {**os.environ, "PYTHONPATH": python_path(), "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    done = subprocess.run(
        [python, "-m", "kimideploy.workloads", workload, "--spec", str(path)],
        capture_output=True,
        text=True,
        env=env,
    )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise WorkloadFailedError(f"{workload} {spec.run_id} failed:\n{done.stderr[-4000:]}")
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return seconds, events


def conversations(root: Path, samples: int, words: int) -> None:
    dataset_record.claim(root, {"stage": "datagen", "bench": "train-precision"}, {})
    shard = root / "shard-00000"
    shard.mkdir(parents=True, exist_ok=True)
    draw = random.Random(0)
    rows = []
    for i in range(samples):
        answer = " ".join(draw.choice(WORDS) for _ in range(words))
        rows.append(
            json.dumps(
                {
                    "format": SAMPLE_FORMAT,
                    "id": f"s{i:05d}",
                    "prompt_index": i,
                    "messages": [{"role": "user", "content": f"question {i}"}],
                    "answer": answer,
                    "reasoning": "thinking",
                    "tools": None,
                    "tool_calls": [],
                }
            )
        )
    (shard / "chunk-000001.jsonl").write_text("\n".join(rows) + "\n")


def step_seconds(events: list[dict[str, Any]]) -> float:
    """Median seconds of one step (forward, backward, optimizer), after the first two steps
    (compilation and warm-up)."""
    steps = sorted(e["step_s"] for e in events if e["event"] == "progress" and e["step"] > 2)
    return steps[len(steps) // 2] if steps else float("nan")


def summary(events: list[dict[str, Any]]) -> dict[str, Any]:
    progress = [e for e in events if e["event"] == "progress"]
    result = [e for e in events if e["event"] == "result"][-1]
    held = (result.get("held_out") or {}).get("mean_acceptance_length") or {}
    return {
        "steps": progress[-1]["step"],
        "first_loss": progress[0]["loss"],
        "last_loss": progress[-1]["loss"],
        "held_out": held,
        "seconds_per_step": step_seconds(events),
    }


def bf16_copy(drafter: Path, out: Path) -> Path:
    """The drafter's files with every floating tensor in bf16 (what a published base drafter
    usually is)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(drafter, out)
    weights = out / "model.safetensors"
    tensors = {
        k: v.to(torch.bfloat16) if v.is_floating_point() else v
        for k, v in load_file(str(weights)).items()
    }
    save_file(tensors, str(weights), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["torch_dtype"] = config["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpu-shape", action="store_true", help="Kimi-K2.5's width (a GPU)")
    parser.add_argument("--steps", type=int, default=12, help="Training steps per run")
    parser.add_argument("--out", type=Path, default=None, help="Keep the work here")
    parser.add_argument("--loss", default="eager", choices=["eager", "fused"])
    parser.add_argument("--no-finetune", action="store_true", help="Skip the bf16 base drafter")
    args = parser.parse_args()
    size = shapes(args.gpu_shape)
    work = args.out or Path(tempfile.mkdtemp(prefix="kimideploy-train-precision-"))
    work.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    model = work / "target"
    if not (model / "config.json").is_file():
        subprocess.run(
            [
                python,
                "-c",
                MAKE_TARGET,
                str(model),
                str(size["hidden"]),
                str(size["heads"]),
                str(size["vocab"]),
                str(size["layers"]),
            ],
            check=True,
            env={**os.environ, "PYTHONPATH": python_path()},
        )
    target = TargetRef(
        repo="bench/deepseek-v3-shaped",
        revision="0" * 40,
        served_name="bench",
        path=str(model),
        num_hidden_layers=size["layers"],
        hidden_size=size["hidden"],
        vocab_size=size["vocab"],
    )
    layers = LayerSelection(ids=[1, 2, 3], convention="vllm", vllm_ids=[1, 2, 3])
    conversations(work / "conv", size["samples"], size["words"])
    cuda = _cuda()
    dtype = "bfloat16" if cuda else "float32"
    fingerprint = {"stage": "extract", "dtype": dtype}
    extract = ExtractSpec(
        run_id="x",
        cluster="bench",
        shards=1,
        target=target,
        conversations_dir=str(work / "conv"),
        output_dir=str(work / "hs"),
        layers=layers,
        dtype=dtype,
        backend="transformers",
        tensor_parallel_size=1,
        expected_bytes=10**9,
        fingerprint=fingerprint,
    )
    seconds, _ = run(python, "extract", extract, work)
    print(f"extract (transformers, {dtype}): {seconds:.1f} s for {size['samples']} samples")
    vocab = VocabSpec(
        run_id="v",
        cluster="bench",
        target=target,
        conversations_dir=str(work / "conv"),
        output_dir=str(work / "vocab"),
        draft_vocab_size=size["draft_vocab"],
    )
    run(python, "vocab", vocab, work)
    batch = 4
    epochs = max(1, -(-args.steps * batch // int(size["samples"] * 0.9)))
    common = {
        "cluster": "bench",
        "shards": 1,
        "target": target,
        "drafter": "bench",
        "base_drafter_path": None,
        "hidden_states_dir": str(work / "hs"),
        "vocab_dir": str(work / "vocab"),
        "layers": layers,
        "draft_vocab_size": size["draft_vocab"],
        "num_speculative_tokens": 3,
        "mode": "offline",
        "nodes": 1,
        "gpus_per_node": 1,
        "epochs": epochs,
        "lr": 3e-4,
        "batch_size": batch,
        "max_seq_len": 2048,
        "checkpoint_every_steps": 10**6,
        "held_out_fraction": 0.1,
        "held_out_max_samples": 16,
        "loader_workers": 2,
        "loss_implementation": args.loss,
    }
    figures: dict[str, dict[str, Any]] = {}
    failed = 0
    for precision in ("bf16", "fp32"):
        spec = TrainSpec(
            run_id=precision,
            precision=precision,
            checkpoint_dir=str(work / f"ckpt-{precision}"),
            output_dir=str(work / f"drafter-{precision}"),
            **common,
        )
        try:
            seconds, events = run(python, "train", spec, work)
        except WorkloadFailedError as exc:  # the other runs' figures still print
            print(f"train {precision}: FAILED\n{exc}")
            failed += 1
            # Once more without the held-out judgement, so the step time is still measured.
            spec = spec.model_copy(
                update={
                    "held_out_fraction": 0.0,
                    "run_id": f"{precision}x",
                    "checkpoint_dir": f"{spec.checkpoint_dir}-x",
                }
            )
            try:
                seconds, events = run(python, "train", spec, work)
            except WorkloadFailedError as again:
                print(f"train {precision} without the held-out judgement: FAILED\n{again}")
                continue
            print(f"train {precision} without the held-out judgement: ran")
        figures[precision] = {**summary(events), "seconds": round(seconds, 1)}
        print(f"train {precision}: {json.dumps(figures[precision])}")
    trained = next((work / f"drafter-{p}" for p in ("fp32", "bf16") if p in figures), None)
    if trained is not None and not args.no_finetune:
        base = bf16_copy(trained, work / "base-bf16")
        spec = TrainSpec(
            run_id="finetune",
            precision="bf16",
            checkpoint_dir=str(work / "ckpt-finetune"),
            output_dir=str(work / "drafter-finetune"),
            **{**common, "base_drafter_path": str(base)},
        )
        try:
            _, events = run(python, "train", spec, work)
            print(f"fine-tune of a bf16 base drafter (bf16): {json.dumps(summary(events))}")
        except WorkloadFailedError as exc:
            print(f"fine-tune of a bf16 base drafter: FAILED\n{exc}")
            failed += 1
    if {"fp32", "bf16"} <= set(figures):
        fp32, bf16 = figures["fp32"]["seconds_per_step"], figures["bf16"]["seconds_per_step"]
        device = "GPU" if cuda else "CPU"
        print(
            f"step time fp32 / bf16 on this {device}: {fp32 / bf16:.2f}x "
            f"({fp32:.3f} s vs {bf16:.3f} s per step, median after two warm-up steps)"
        )
        held = {
            k: round(figures["bf16"]["held_out"][k] - v, 4)
            for k, v in figures["fp32"]["held_out"].items()
        }
        print(f"held-out mean acceptance length, bf16 - fp32, per k: {held}")
    return 1 if failed else 0


def _cuda() -> bool:
    done = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() == "True"


if __name__ == "__main__":
    sys.exit(main())
