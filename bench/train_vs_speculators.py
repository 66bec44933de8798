"""kimideploy's train workload side by side with speculators' own trainer (`python -m
speculators.train`, the pinned 0.9) on the same features, on one machine, in one run.

Run: .venv/bin/python bench/train_vs_speculators.py [--spec SPEC.json] [--epochs N] [--keep DIR]

Without --spec, it first runs the pipeline tier's training test (real vLLM 0.32 datagen and
extraction on the informative test target, ~5 minutes) and takes the localized train spec it
leaves. Both trainers then train the same drafter shape (one Llama decoder layer, the spec's
layers, vocabulary maps, ttt_steps, step-loss decay, lr, weight decay, warmup and cosine
schedule) for the same number of optimizer steps on the same training samples, and both results
are judged by the train workload's held-out judgement (the serving walk vLLM counts, on the same
held-out samples: speculators' validation split is set to exactly those). Printed: steps/s and
tokens/s of each training loop (start-up, data conversion and judging excluded), the held-out mean
acceptance length per k after those steps, and the ratios.

What differs, by design of the two trainers: speculators packs samples into sequences of
`--total-seq-len` positions (set to kimideploy's mean tokens per step, so a step sees about as
many tokens; its packing pads, so its positions/s count padding), and its cosine schedule decays
to 0 where kimideploy's stops at `min_lr_ratio`. kimideploy feeds `batch_size` whole samples per
step. speculators' trainer runs on a GPU only (GPU_ONLY says why): on a machine without one the
bench prints kimideploy's figures and says so. Read the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PIPELINE_TEST = (
    "tests/pipeline/test_acceptance.py::test_training_judged_every_checkpoint_and_wrote_the_best"
)


def pipeline_spec(workdir: Path) -> Path:
    """The good drafter's localized train spec, from a run of the pipeline tier's training test."""
    base = workdir / "pipeline"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={base}",
         PIPELINE_TEST],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"the pipeline test that makes the features failed:\n{done.stdout[-3000:]}")
    spec = pipeline_spec_in(sorted(base.glob("cluster*/train-spec.json")))
    if spec is None:
        sys.exit(f"the pipeline test left no train spec of drafter good under {base}")
    return spec


def pipeline_spec_in(found: list[Path]) -> Path | None:
    """A kept pipeline run's spec of drafter good (--keep reuses its features)."""
    return next((p for p in found if json.loads(p.read_text())["drafter"] == "good"), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, help="a localized train spec (default: make one)")
    parser.add_argument("--epochs", type=int, default=1, help="kimideploy epochs (default 1)")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it (features too)")
    parser.add_argument(
        "--here",
        action="store_true",
        help="run both trainers with this interpreter (a GPU machine's torch, speculators and "
        "datasets) instead of the CPU vLLM venv; needs --spec",
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    sys.path.insert(0, str(ROOT))
    if args.here:
        if args.spec is None:
            parser.error("--here needs --spec (features made on this machine)")
        python, env = Path(sys.executable), dict(os.environ)
    else:
        from tests.pipeline.pods import cpu_env

        from kimideploy.images.cpu_vllm import cpu_vllm_python

        python = cpu_vllm_python()
        env = cpu_env(python)
    with tempfile.TemporaryDirectory(prefix="kimideploy-bench-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        kept = sorted((workdir / "pipeline").glob("cluster*/train-spec.json"))
        spec = args.spec or (kept and pipeline_spec_in(kept)) or pipeline_spec(workdir)
        for stale in ("ours", "theirs", "theirs-logs", "speculators-data"):
            shutil.rmtree(workdir / stale, ignore_errors=True)
        out = workdir / "figures.json"
        command = [str(python), __file__, "--inside", str(spec), str(workdir), str(args.epochs),
                   str(out)]  # fmt: skip
        done = subprocess.run(command, env=env)
        if done.returncode != 0:
            return done.returncode
        print_figures(json.loads(out.read_text()))
    return 0


GPU_ONLY = (
    "speculators 0.9's trainer runs on a GPU only: it moves the model and each batch to the "
    "local rank as a CUDA device (speculators/train/trainer.py, `self.model.to(self.local_rank)`) "
    "and always attends through a FlexAttention BlockMask, which torch's eager attention cannot "
    'take and whose backward torch 2.13 does not implement on CPU ("FlexAttention does not '
    'support backward on CPU"). Run this bench on a GPU machine for the side-by-side figures.'
)


def print_figures(figures: dict[str, Any]) -> None:
    ours, theirs = figures["kimideploy"], figures["speculators"]
    if theirs is None:
        print(f"features: {figures['features']}")
        lengths = ", ".join(f"k={k} {v:.3f}" for k, v in sorted(ours["held_out"].items()))
        print(f"kimideploy: {ours['steps']} steps, {ours['steps_per_s']:.2f} steps/s, "
              f"{ours['tokens_per_s']:.0f} tokens/s, "
              f"held-out mean acceptance length {lengths}")  # fmt: skip
        print(f"speculators: not run. {GPU_ONLY}")
        return
    print(f"features: {figures['features']}")
    print(f"steps: {ours['steps']} each; kimideploy batch {figures['batch_size']} samples, "
          f"speculators --total-seq-len {figures['total_seq_len']}")  # fmt: skip
    rows = [
        ("training loop (s)", f"{ours['seconds']:.1f}", f"{theirs['seconds']:.1f}"),
        ("steps/s", f"{ours['steps_per_s']:.2f}", f"{theirs['steps_per_s']:.2f}"),
        ("tokens/s (speculators: packed positions)", f"{ours['tokens_per_s']:.0f}",
         f"{theirs['positions_per_s']:.0f}"),
    ]  # fmt: skip
    for k in sorted(ours["held_out"], key=int):
        rows.append((f"held-out mean acceptance length, k={k}", f"{ours['held_out'][k]:.3f}",
                     f"{theirs['held_out'][k]:.3f}"))  # fmt: skip
    print(f"{'':44} {'kimideploy':>12} {'speculators':>12}")
    for name, a, b in rows:
        print(f"{name:44} {a:>12} {b:>12}")
    ratio = ours["steps_per_s"] / theirs["steps_per_s"]
    print(f"steps/s, kimideploy / speculators: {ratio:.2f}x")
    deepest = max(ours["held_out"], key=int)
    print(f"held-out length at k={deepest}, kimideploy - speculators: "
          f"{ours['held_out'][deepest] - theirs['held_out'][deepest]:+.3f}")  # fmt: skip


# -- inside the CPU vLLM venv (torch, speculators, datasets) -----------------------------------


def inside(spec_path: Path, workdir: Path, epochs: int, out: Path) -> int:
    from kimideploy.config.specs import TrainSpec
    from kimideploy.workloads import heldout, train
    from kimideploy.workloads.train_features import StoredFeatures
    from kimideploy.workloads.vocab import load_vocab_maps

    spec = TrainSpec.model_validate_json(spec_path.read_text())
    spec = spec.model_copy(update={
        "epochs": epochs, "checkpoint_every_steps": 10**9, "resume_dir": None,
        "checkpoint_dir": str(workdir / "ours" / "checkpoints"),
        "output_dir": str(workdir / "ours" / "drafter"), "run_id": "bench",
    })  # fmt: skip
    features = StoredFeatures(spec)
    ids = [features.sample_id(i) for i in range(features.samples)]
    split = heldout.split_samples(ids, spec.held_out_fraction, spec.held_out_max_samples)
    if not split.held_out:
        sys.exit(f"{spec_path}: held_out_fraction is 0; nothing to judge on")
    d2t, t2d = load_vocab_maps(Path(spec.vocab_dir), spec.target.vocab_size)
    data, tokens_per_epoch = export(spec, features, split, d2t, t2d, workdir / "speculators-data")
    ours = run_ours(spec, workdir)
    total_seq_len = max(round(tokens_per_epoch * epochs / ours["steps"]), spec.max_seq_len + 1)
    theirs: dict[str, Any] | None = None
    import torch

    if torch.cuda.is_available():
        ratio = len(split.train) / (len(split.train) + len(split.held_out))
        theirs = run_theirs(spec, data, workdir, ours["steps"], total_seq_len, epochs, ratio)
        steps = train_data_steps(split, spec)
        judge = train.Trainer(
            spec, features, train._ranks(), d2t, t2d=t2d, split=split, steps_per_epoch=steps
        )
        # The run's own held-out judgement, on speculators' checkpoint instead of its model.
        judge.model = load_speculators_checkpoint(theirs.pop("checkpoint")).to(judge.device)
        judged = judge._judge()
        assert judged is not None
        theirs["held_out"] = judged["mean_acceptance_length"]
    out.write_text(json.dumps({
        "features": spec.hidden_states_dir, "batch_size": spec.batch_size,
        "total_seq_len": total_seq_len, "kimideploy": ours, "speculators": theirs,
    }))  # fmt: skip
    return 0


def train_data_steps(split: Any, spec: Any) -> int:
    from kimideploy.workloads import train_data

    return train_data.steps_per_epoch(len(split.train), 1, spec.batch_size)


def export(spec: Any, features: Any, split: Any, d2t: Any, t2d: Any,
           where: Path) -> tuple[Path, int]:  # fmt: skip
    """The same samples in speculators' layout: an Arrow dataset (input_ids, loss_mask, seq_len)
    and hidden_states/hs_<i>.safetensors ([T, aux layers + last, H], token_ids), training samples
    first and the held-out ones last, so that its validation split is exactly the held-out set."""
    import numpy as np
    import torch
    from datasets import Dataset
    from safetensors.torch import save_file

    states = where / "hidden_states"
    states.mkdir(parents=True)
    rows: dict[str, list[Any]] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    tokens = 0
    for number, index in enumerate([*split.train, *split.held_out]):
        saved = features.load(index)
        length = min(int(saved["input_ids"].shape[0]), spec.max_seq_len + 1)
        aux = saved["aux_hidden_states"].float()[:, :length]  # [layers, T, H]
        last = saved["last_hidden_state"].float()[:length][None]
        hidden = torch.cat([aux, last]).permute(1, 0, 2).contiguous()  # [T, layers + 1, H]
        token_ids = saved["input_ids"][:length].long().contiguous()
        save_file({"hidden_states": hidden, "token_ids": token_ids},
                  str(states / f"hs_{number}.safetensors"))  # fmt: skip
        rows["input_ids"].append(token_ids.tolist())
        rows["loss_mask"].append(saved["loss_mask"][:length].long().tolist())
        rows["seq_len"].append(length)
        if number < len(split.train):
            tokens += length
    dataset = Dataset.from_dict(rows)
    dataset.set_format(type="torch")
    dataset.save_to_disk(str(where))
    np.save(where / "d2t.npy", d2t.numpy())
    np.save(where / "t2d.npy", t2d.numpy())
    return where, tokens


def run_ours(spec: Any, workdir: Path) -> dict[str, Any]:
    path = workdir / "ours-spec.json"
    path.write_text(spec.model_dump_json())
    done = subprocess.run([sys.executable, "-m", "kimideploy.workloads", "train", "--spec",
                           str(path)], capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"kimideploy's train workload failed:\n{done.stderr[-3000:]}")
    found = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    progress = [e for e in found if e.get("event") == "progress"][-1]
    judged = [e for e in found if e.get("event") == "evaluation"][-1]
    assert judged["step"] == progress["step"], (judged["step"], progress["step"])
    steps = int(progress["step"])
    return {
        "steps": steps,
        "seconds": steps / float(progress["rate"]),
        "steps_per_s": float(progress["rate"]),
        "tokens_per_s": float(progress["tokens_per_s"]),
        "held_out": judged["held_out"]["mean_acceptance_length"],
    }


def run_theirs(spec: Any, data: Path, workdir: Path, steps: int, total_seq_len: int,
               epochs: int, train_ratio: float) -> dict[str, Any]:  # fmt: skip
    """`python -m speculators.train` for `steps` optimizer steps. Its packed epochs hold at least
    as many batches as kimideploy's (the same tokens, packed with some padding), so `epochs`
    epochs reach `steps`; the time between its first epoch's start and the last one's end, less
    its validation passes between epochs, is its training loop."""
    save = workdir / "theirs"
    warmup = round(spec.warmup_ratio * steps)
    schedule = {"cosine": "cosine", "linear": "linear", "constant": "none"}[spec.lr_schedule]
    command = [
        sys.executable, "-m", "speculators.train", "--speculator-type", "eagle3",
        "--verifier-name-or-path", spec.target.path, "--data-path", str(data),
        "--save-path", str(save), "--log-dir", str(workdir / "theirs-logs"),
        "--d2t-path", str(data / "d2t.npy"), "--t2d-path", str(data / "t2d.npy"),
        "--draft-vocab-size", str(spec.draft_vocab_size),
        "--target-layer-ids", *[str(i) for i in spec.layers.vllm_ids],
        "--num-layers", str(spec.draft_layers), "--draft-arch", "llama",
        "--norm-before-residual", "--draft-attn-impl", "simple_flex_attention",
        "--ttt-steps", str(spec.ttt_steps), "--ttt-step-loss-decay", str(spec.ttt_step_loss_decay),
        "--lr", str(spec.lr), "--weight-decay", str(spec.weight_decay),
        "--scheduler-type", schedule, "--scheduler-warmup-steps", str(warmup),
        "--scheduler-total-steps", str(steps), "--epochs", str(epochs), "--max-steps", str(steps),
        "--total-seq-len", str(total_seq_len), "--train-data-ratio", f"{train_ratio:.6f}",
        "--hidden-states-dtype", "bfloat16" if spec.precision == "bf16" else "float32",
        "--num-workers", "0", "--on-missing", "raise",
        "--seed", str(spec.seed), "--no-resume-from-checkpoint", "--log-freq", "1000000",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)  # fmt: skip
    assert process.stdout is not None
    started = ended = validating = None
    validations: list[tuple[float, float]] = []
    tail: list[str] = []
    for line in process.stdout:
        tail = [*tail[-60:], line]
        now = time.monotonic()
        if started is None and re.search(r"Training epoch 1/\d+ started", line):
            started = now
        if re.search(r"Training epoch \d+/\d+ completed", line):
            ended = now
        if re.search(r"Validation epoch \d+/\d+ started", line):
            validating = now
        if validating is not None and re.search(r"Validation epoch \d+/\d+ completed", line):
            validations.append((validating, now))
            validating = None
    if process.wait() != 0 or started is None or ended is None:
        sys.exit("speculators' trainer failed:\n" + "".join(tail))
    # Validation passes between training epochs, not the one after the last.
    seconds = ended - started - sum(b - a for a, b in validations if b <= ended)
    epochs = sorted((p for p in save.iterdir() if p.is_dir() and p.name.isdigit()),
                    key=lambda p: int(p.name))  # fmt: skip
    return {
        "steps": steps,
        "seconds": seconds,
        "steps_per_s": steps / seconds,
        "positions_per_s": steps * total_seq_len / seconds,
        "checkpoint": str(epochs[-1]),
    }


def load_speculators_checkpoint(path: str) -> Any:
    import torch
    from speculators.models.eagle3.core import Eagle3DraftModel

    model = Eagle3DraftModel.from_pretrained(path).to(torch.float32)
    model.config.transformer_layer_config._attn_implementation = "eager"
    return model


if __name__ == "__main__":
    if sys.argv[1:2] == ["--inside"]:
        os.environ.setdefault("PYTHONPATH", str(ROOT / "src"))
        sys.path.insert(0, str(ROOT / "src"))
        spec_arg, workdir_arg, epochs_arg, out_arg = sys.argv[2:6]
        sys.exit(inside(Path(spec_arg), Path(workdir_arg), int(epochs_arg), Path(out_arg)))
    sys.exit(main())
