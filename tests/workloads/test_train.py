"""train: a tiny EAGLE-3 drafter (speculators 0.9.0's model) on features the data pipeline extracted
from the tiny target, on CPU: loss going down, checkpoint and resume at the same step with the
same numbers, two ranks through torch.distributed, a drafter vLLM 0.16.0's own config loader
reads, and the refusals that stop a wrong dataset before any GPU time is spent."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.drafters import to_vllm_layer_ids
from kimideploy.config.specs import LayerSelection, TrainSpec, VocabSpec
from kimideploy.formats.safetensors_files import read_header
from kimideploy.images.verify import vllm_venv
from tests.conftest import REPO
from tests.tmpfs import tmpfs
from tests.workloads.conftest import run_workload
from tests.workloads.test_extract_vocab_inspect import extract_spec, features_fingerprint, target

DRAFT_VOCAB = 64


@pytest.fixture(scope="module")
def features(
    tmp_path_factory: pytest.TempPathFactory, torch_python: Path, tiny_model: Path
) -> Path:
    """Hidden states (vLLM ids [1, 2]) and vocab maps, made by the pipeline's own workloads."""
    root = tmp_path_factory.mktemp("pipeline")
    extract = run_workload(
        "extract", extract_spec(root, tiny_model, [1, 2], "vllm"), python=str(torch_python)
    )
    _, err = extract.communicate(timeout=300)
    assert extract.returncode == 0, err
    vocab = VocabSpec(run_id="v", cluster="test", target=target(tiny_model), conversations_dir=str(root / "conv"),
                      output_dir=str(root / "vocab"), draft_vocab_size=DRAFT_VOCAB)  # fmt: skip
    (root / "vocab.json").write_text(vocab.model_dump_json())
    process = run_workload("vocab", root / "vocab.json", python=str(torch_python))
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return root


def train_spec(
    where: Path, features: Path, model: Path, ids: tuple[int, ...] = (1, 2), convention: str = "vllm", **changes: Any
) -> Path:  # fmt: skip
    ids = list(ids)
    layers = LayerSelection(
        ids=ids, convention=convention, vllm_ids=to_vllm_layer_ids(ids, convention)
    )  # type: ignore[arg-type]
    values = {"run_id": "r1", "cluster": "test", "shards": 1, "target": target(model), "drafter": "tiny-v1",
              "base_drafter_path": None, "hidden_states_dir": str(features / "hs"), "vocab_dir": str(features / "vocab"),
              "checkpoint_dir": str(where / "ckpt"), "output_dir": str(where / "drafter"), "layers": layers,
              "draft_vocab_size": DRAFT_VOCAB, "num_speculative_tokens": 3, "mode": "offline", "nodes": 1,
              "gpus_per_node": 1, "epochs": 15, "lr": 3e-3, "batch_size": 4, "max_seq_len": 512,
              "checkpoint_every_steps": 5, **changes}  # fmt: skip
    where.mkdir(parents=True, exist_ok=True)
    path = where / "train.json"
    path.write_text(TrainSpec(**values).model_dump_json())
    return path


def events(out: str, kind: str) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [e for e in found if e["event"] == kind]


def train(python: Path, spec: Path, timeout: float = 600) -> tuple[int, str, str]:
    process = run_workload("train", spec, python=str(python))
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def losses(out: str) -> dict[int, float]:
    return {p["step"]: p["loss"] for p in events(out, "progress")}


def rates(out: str) -> dict[int, float]:
    return {p["step"]: p["lr"] for p in events(out, "progress")}


def offline_losses(
    python: Path, where: Path, features: Path, model: Path, **settings: Any
) -> dict[int, float]:
    code, out, err = train(python, train_spec(where, features, model, **settings))
    assert code == 0, err
    return losses(out)


def stop_after(python: Path, spec: Path, step: int) -> tuple[int, str]:
    """SIGTERM (what the kubelet sends on eviction) once `step` is reported: (the step of the
    last checkpoint, stderr); the drain must exit 75."""
    process = run_workload("train", spec, python=str(python))
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("{") and json.loads(line).get("step", 0) >= step:
            process.send_signal(signal.SIGTERM)
            break
    rest, err = process.communicate(timeout=300)
    assert process.returncode == 75, err
    return events("".join(lines) + rest, "checkpoint")[-1]["step"], err


VLLM_READS = """
import json, sys
from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig
config = SpeculatorsConfig.from_pretrained(sys.argv[1])
raw = json.load(open(sys.argv[1] + "/config.json"))
print(json.dumps({"ids": config.eagle_aux_hidden_state_layer_ids, "draft_vocab_size": config.draft_vocab_size,
                  "architectures": config.architectures,
                  "speculative": SpeculatorsConfig.extract_vllm_speculative_config(raw)}))
"""


def test_training_lowers_the_loss_and_writes_a_drafter_vllm_reads(
    tmp_path: Path, speculators_python: Path, tiny_model: Path, features: Path
) -> None:
    code, out, err = train(speculators_python, train_spec(tmp_path, features, tiny_model))
    assert code == 0, err
    progress = events(out, "progress")
    assert [p["step"] for p in progress] == list(
        range(1, 16)
    )  # 4 samples, batch 4: one step per epoch
    assert progress[-1]["loss"] < 0.8 * progress[0]["loss"]  # the same batch every step
    assert len(progress[-1]["accuracy_per_position"]) == 3 and progress[-1]["tokens_per_s"] > 0
    assert [e["step"] for e in events(out, "checkpoint")][:3] == [
        1,
        2,
        3,
    ]  # each epoch, and every 5
    [result] = events(out, "result")
    drafter = tmp_path / "drafter"
    config = json.loads((drafter / "config.json").read_text())
    assert (
        config["eagle_aux_hidden_state_layer_ids"] == [1, 2]
        and config["draft_vocab_size"] == DRAFT_VOCAB
    )
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    lineage = json.loads((drafter / "kimideploy-lineage.json").read_text())
    assert lineage["trained_for"] == "test/tiny" and lineage["trained_for_revision"] == "1" * 40
    assert lineage["dataset"]["convention"] == "vllm" and lineage["dataset"]["samples"] == 4
    assert (
        lineage["metrics"]["loss"] == result["loss"] and lineage["speculators_version"] == "0.9.0"
    )
    assert len(lineage["config_sha256"]) == 64
    vllm_python = vllm_venv("0.16.0") / "bin" / "python"
    read = subprocess.run(
        [str(vllm_python), "-c", VLLM_READS, str(drafter)],
        capture_output=True,
        text=True,
        check=True,
    )
    loaded = json.loads(read.stdout.strip().splitlines()[-1])
    assert loaded["ids"] == [1, 2] and loaded["draft_vocab_size"] == DRAFT_VOCAB
    assert loaded["architectures"] == ["Eagle3LlamaForCausalLM"]
    assert loaded["speculative"]["num_speculative_tokens"] == 3
    # A second run never overwrites the first drafter: it moves aside.
    code, out, err = train(speculators_python, train_spec(tmp_path, features, tiny_model, run_id="r2", epochs=1,
                                                           checkpoint_dir=str(tmp_path / "ckpt2")))  # fmt: skip
    assert code == 0, err
    assert len(list(tmp_path.glob("drafter.previous-*"))) == 1


def test_a_stopped_run_resumes_at_its_step_with_the_same_numbers(
    tmp_path: Path, speculators_python: Path, tiny_model: Path, features: Path
) -> None:
    # A warmed-up cosine schedule: the resumed run must continue on the same learning rates.
    settings = {"epochs": 20, "batch_size": 2, "checkpoint_every_steps": 1000,
                "lr_schedule": "cosine", "warmup_ratio": 0.1, "min_lr_ratio": 0.0}  # fmt: skip
    code, out, err = train(
        speculators_python, train_spec(tmp_path / "straight", features, tiny_model, **settings)
    )
    assert code == 0, err
    straight, straight_lr = losses(out), rates(out)
    assert straight_lr[1] < straight_lr[4] and straight_lr[40] < 0.05 * max(straight_lr.values())
    assert max(straight) == 40  # 4 samples, batch 2: two steps per epoch
    spec = train_spec(tmp_path / "stopped", features, tiny_model, **settings)
    stopped_at, err = stop_after(speculators_python, spec, 5)
    assert 5 <= stopped_at < 40 and "a restarted pod resumes there" in err
    code, out, err = train(speculators_python, spec)
    assert code == 0, err
    [resumed] = events(out, "resumed")
    assert resumed["step"] == stopped_at
    after = losses(out)
    assert min(after) == stopped_at + 1 and max(after) == 40
    for step, loss in after.items():
        assert loss == pytest.approx(straight[step], rel=1e-4, abs=1e-6), step
        assert rates(out)[step] == straight_lr[step], step


POISON = """
import sys, torch
from safetensors.torch import load_file, save_file
sample = load_file(sys.argv[1])
sample["aux_hidden_states"][..., 0] = float("nan")
save_file(sample, sys.argv[1])
"""


def test_a_step_whose_loss_is_not_finite_is_skipped_and_counted(
    tmp_path: Path, speculators_python: Path, tiny_model: Path, features: Path
) -> None:
    """One sample's hidden states hold NaN (a bad shard, an overflow upstream): the two steps
    that train on it are skipped, counted with their gradient norm, and the weights stay
    finite; without the skip every later loss is NaN."""
    poisoned = tmp_path / "features"
    shutil.copytree(features, poisoned)
    first = sorted((poisoned / "hs").rglob("*.safetensors"))[0]
    subprocess.run([str(speculators_python), "-c", POISON, str(first)], check=True)
    spec = train_spec(tmp_path / "run", poisoned, tiny_model, epochs=2, batch_size=1,
                      checkpoint_every_steps=1000)  # fmt: skip
    code, out, err = train(speculators_python, spec)
    assert code == 0, err
    progress = events(out, "progress")
    skipped = [p["step"] for p in progress if p["loss"] is None]
    assert len(skipped) == 2 and progress[-1]["skipped_steps"] == 2  # one sample, two epochs
    assert all(progress[s - 1]["grad_norm"] is None for s in skipped)
    trained = [p for p in progress if p["loss"] is not None]
    assert len(trained) == 6 and all(math.isfinite(p["loss"]) for p in trained)
    assert all(p["grad_norm"] > 0 for p in trained)
    assert err.count("not finite on a rank: skipped on every rank") == 2
    [result] = events(out, "result")
    assert result["skipped_steps"] == 2


def two_ranks(python: Path, spec: Path) -> subprocess.Popen[str]:
    """Two training ranks on this host through torch.distributed.run (gloo), started, not awaited."""
    command = [str(python), "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
               "--nproc-per-node=2", "-m", "kimideploy.workloads", "train", "--spec", str(spec)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip


def test_two_ranks_train_through_torch_distributed(
    tmp_path: Path, speculators_python: Path, tiny_model: Path, features: Path
) -> None:
    spec = train_spec(tmp_path, features, tiny_model, epochs=3, batch_size=1)
    ranks = two_ranks(speculators_python, spec)
    stdout, stderr = ranks.communicate(timeout=600)
    assert ranks.returncode == 0, stderr[-3000:]
    progress = events(stdout, "progress")
    assert [p["step"] for p in progress] == [1, 2, 3, 4, 5, 6]  # 4 samples over 2 ranks, batch 1
    lineage = json.loads((tmp_path / "drafter" / "kimideploy-lineage.json").read_text())
    assert lineage["world_size"] == 2


@pytest.mark.parametrize(
    ("ids", "convention", "changes", "message"),
    [
        ((0, 1), "sglang", {}, "Set train.convert_layer_convention: true"),
        ((2, 3), "vllm", {}, "they are different layers"),
        ((1, 2), "vllm", {"batch_size": 8}, "cannot fill one batch of 8"),
        ((1, 2), "vllm", {"mode": "online"}, "train.mode online"),
        # Features whose fingerprint is not the one the spec expects (other layers).
        (
            (1, 2),
            "vllm",
            {
                "data_fingerprint": features_fingerprint(
                    LayerSelection(ids=[2, 3], convention="vllm", vllm_ids=[2, 3])
                )
            },
            "layers.vllm_ids: recorded [1, 2], now [2, 3]",
        ),
    ],
)
def test_a_dataset_that_does_not_fit_is_refused_before_training(
    tmp_path: Path, speculators_python: Path, tiny_model: Path, features: Path,
    ids: tuple[int, ...], convention: str, changes: dict[str, Any], message: str,
) -> None:  # fmt: skip
    code, _, err = train(
        speculators_python, train_spec(tmp_path, features, tiny_model, ids, convention, **changes)
    )
    assert code == 2 and message in err
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "drafter").exists()


def test_an_explicit_conversion_trains_and_writes_vllm_ids(
    tmp_path: Path, speculators_python: Path, tiny_model: Path, features: Path
) -> None:
    spec = train_spec(
        tmp_path, features, tiny_model, (0, 1), "sglang", convert_layer_convention=True, epochs=1
    )
    code, _, err = train(speculators_python, spec)
    assert code == 0, err
    assert (
        "drafter in the sglang convention [0, 1] name the same layers; the drafter is written with vLLM's [1, 2]"
        in err
    )
    config = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2]
    lineage = json.loads((tmp_path / "drafter" / "kimideploy-lineage.json").read_text())
    assert lineage["written_as"] == {"ids": [0, 1], "convention": "sglang"}


@pytest.fixture(scope="module")
def duplicated(features: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The features with every sample copied under 12 more ids: held-out samples (chosen by id)
    are then copies of trained ones, so the held-out judgement follows what training learns."""
    import shutil

    root = tmp_path_factory.mktemp("duplicated")
    shutil.copytree(features / "vocab", root / "vocab")
    shutil.copytree(features / "hs", root / "hs")
    for shard in (root / "hs").glob("shard-*"):
        manifest = json.loads((shard / "manifest.json").read_text())
        originals = sorted(shard.glob("*.safetensors"))
        for original in originals:
            for copy in range(12):
                shutil.copy(original, shard / f"{original.stem}-copy{copy}.safetensors")
        manifest["samples"] = len(list(shard.glob("*.safetensors")))
        (shard / "manifest.json").write_text(json.dumps(manifest))
    return root


def test_held_out_judgement_keeps_the_best_checkpoint_when_the_last_is_worse(
    tmp_path: Path, speculators_python: Path, tiny_model: Path, duplicated: Path
) -> None:
    """Constructed: a learning rate warmed up to 0.5 wrecks the drafter in the second half, so the
    last checkpoint is worse than an earlier one; the drafter written is the earlier one, and the
    lineage and the result say which step and why."""
    spec = train_spec(tmp_path, duplicated, tiny_model, epochs=1, batch_size=4, lr=0.5,
                      warmup_ratio=0.5, lr_schedule="constant", held_out_fraction=0.2,
                      checkpoint_every_steps=1)  # fmt: skip
    code, out, err = train(speculators_python, spec)
    assert code == 0, err
    judged = events(out, "evaluation")
    lengths = {e["step"]: e["held_out"]["mean_acceptance_length"]["3"] for e in judged}
    assert len(lengths) >= 8 and set(judged[0]["held_out"]["mean_acceptance_length"]) == {
        "1",
        "2",
        "3",
    }
    best = max(lengths, key=lambda s: (lengths[s], -s))
    last = max(lengths)
    assert lengths[best] > lengths[last], lengths  # the construction holds
    [result] = events(out, "result")
    assert result["selected"]["step"] == best
    assert (
        f"step {best} has the best held-out mean acceptance length at k=3"
        in result["selected"]["reason"]
    )
    lineage = json.loads((tmp_path / "drafter" / "kimideploy-lineage.json").read_text())
    assert lineage["selected_checkpoint"]["step"] == best
    assert lineage["held_out"]["mean_acceptance_length"]["3"] == lengths[best]
    assert lineage["dataset"]["held_out"]["held_out_samples"] >= 1
    assert f"writing the drafter of step {best}" in err
    # The written weights are the best checkpoint's, not the last step's.
    written, kept = tmp_path / "drafter", tmp_path / "ckpt" / f"step-{best:08d}"
    last_dir = tmp_path / "ckpt" / f"step-{last:08d}"
    assert tensor_bytes(written, "fc.weight") == tensor_bytes(kept, "fc.weight")
    assert tensor_bytes(written, "fc.weight") != tensor_bytes(last_dir, "fc.weight")


def tensor_bytes(folder: Path, name: str) -> bytes:
    header, offset = read_header(folder / "model.safetensors")
    start, end = header[name]["data_offsets"]
    with (folder / "model.safetensors").open("rb") as handle:
        handle.seek(offset + start)
        return handle.read(end - start)


BF16_HELD_OUT_TOLERANCE = 0.05
"""|held-out mean acceptance length, bf16 autocast - fp32| at every k for the same run: measured
on this tier's duplicated features (k=1/2/3) in the runs below; see bench/MEASUREMENTS.md."""


def bf16_copy(drafter: Path, out: Path) -> Path:
    """A drafter's files with every floating tensor stored in bf16, as published base drafters
    usually are (config.json says so too)."""
    import shutil

    shutil.copytree(drafter, out)
    convert = (
        "import sys, torch; from safetensors.torch import load_file, save_file; "
        "w = load_file(sys.argv[1]); "
        "save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in w.items()}, "
        "sys.argv[1], metadata={'format': 'pt'})"
    )
    from kimideploy.images.cpu_vllm import cpu_vllm_python

    subprocess.run(
        [str(cpu_vllm_python()), "-c", convert, str(out / "model.safetensors")], check=True
    )
    config = json.loads((out / "config.json").read_text())
    config["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def test_bf16_autocast_lowers_the_loss_and_judges_like_fp32(
    tmp_path: Path, speculators_python: Path, tiny_model: Path, duplicated: Path
) -> None:
    settings = {"epochs": 2, "batch_size": 4, "held_out_fraction": 0.2,
                "checkpoint_every_steps": 1000, "lr_schedule": "constant"}  # fmt: skip
    judged = {}
    for precision in ("fp32", "bf16"):
        spec = train_spec(
            tmp_path / precision, duplicated, tiny_model, precision=precision, **settings
        )
        code, out, err = train(speculators_python, spec)
        assert code == 0, err
        steps = losses(out)
        assert steps[max(steps)] < 0.8 * steps[min(steps)], (precision, steps)
        judged[precision] = events(out, "result")[-1]["held_out"]["mean_acceptance_length"]
    print(f"held-out mean acceptance length fp32 {judged['fp32']} bf16 {judged['bf16']}")
    for k, fp32 in judged["fp32"].items():
        assert abs(judged["bf16"][k] - fp32) <= BF16_HELD_OUT_TOLERANCE, (k, judged)


def test_a_bf16_base_drafter_is_fine_tuned_over_fp32_master_weights(
    tmp_path: Path, speculators_python: Path, tiny_model: Path, features: Path
) -> None:
    """transformers 5 loads a checkpoint in its own dtype: a bf16 base drafter met fp32 features
    at step 1 before the train workload loaded it in fp32 explicitly."""
    code, _, err = train(
        speculators_python, train_spec(tmp_path / "first", features, tiny_model, epochs=2)
    )
    assert code == 0, err
    base = bf16_copy(tmp_path / "first" / "drafter", tmp_path / "base-bf16")
    for precision in ("bf16", "fp32"):
        spec = train_spec(tmp_path / f"tuned-{precision}", features, tiny_model, epochs=4,
                          base_drafter_path=str(base), precision=precision, run_id=f"t{precision[:2]}")  # fmt: skip
        code, out, err = train(speculators_python, spec)
        assert code == 0, (precision, err[-3000:])
        steps = losses(out)
        assert steps[max(steps)] < steps[min(steps)], (precision, steps)


DISTANCE = """
import json, sys
from safetensors.torch import load_file
base = load_file(sys.argv[1] + "/model.safetensors")
for tuned in sys.argv[2:]:
    other = load_file(tuned + "/model.safetensors")
    print(sum(float(((other[k].float() - v.float()) ** 2).sum()) for k, v in base.items()
              if v.is_floating_point() and k in other))
"""


def test_the_anchor_keeps_a_fine_tune_near_its_base_drafter(
    tmp_path: Path, speculators_python: Path, tiny_model: Path, features: Path
) -> None:
    """A refresh fine-tunes on a narrow dataset: train.anchor_weight pulls the weights toward the
    base drafter's (L2-SP), so the same steps move them far less than a plain fine-tune."""
    code, _, err = train(
        speculators_python, train_spec(tmp_path / "base", features, tiny_model, epochs=2)
    )
    assert code == 0, err
    base = tmp_path / "base" / "drafter"
    tuned = {}
    for weight in (0.0, 50.0):
        where = tmp_path / f"anchor-{weight:g}"
        spec = train_spec(where, features, tiny_model, epochs=3, base_drafter_path=str(base),
                          anchor_weight=weight, run_id=f"a{weight:g}")  # fmt: skip
        code, _, err = train(speculators_python, spec)
        assert code == 0, (weight, err[-3000:])
        tuned[weight] = where / "drafter"
    found = subprocess.run([str(speculators_python), "-c", DISTANCE, str(base),
                            str(tuned[0.0]), str(tuned[50.0])],
                           capture_output=True, text=True, check=True)  # fmt: skip
    free, anchored = map(float, found.stdout.split())
    assert free > 0 and anchored < 0.25 * free, (free, anchored)


def test_loader_workers_feed_the_same_batches_in_the_same_order(
    tmp_path: Path, speculators_python: Path, tiny_model: Path, features: Path
) -> None:
    settings = {"epochs": 6, "batch_size": 2, "checkpoint_every_steps": 1000}
    inline = offline_losses(speculators_python, tmp_path / "inline", features, tiny_model,
                            loader_workers=0, **settings)  # fmt: skip
    loaded = offline_losses(speculators_python, tmp_path / "workers", features, tiny_model,
                            loader_workers=2, **settings)  # fmt: skip
    assert inline == loaded


def test_a_folder_the_pod_cannot_write_stops_training_before_the_first_step(
    tmp_path: Path, speculators_python: Path, tiny_model: Path, features: Path
) -> None:
    """The PCIe host's models volume was a root-owned host path: every epoch ran, then the drafter
    could not be saved, on every retry. A read-only filesystem stands in for it (the tests run as
    root, whom permissions do not stop): the pod says so in seconds, before any step."""
    with tmpfs(tmp_path / "models", "ro,size=64k") as volume:
        spec = train_spec(
            tmp_path, features, tiny_model, output_dir=str(volume / "drafters" / "v4")
        )
        code, out, err = train(speculators_python, spec)
    assert code == 2, err
    assert f"{volume}/drafters cannot be written by uid 0 (Read-only file system" in err
    assert "read-only filesystem" in err and "kimideploy host provision" in err
    assert events(out, "progress") == [] and not (tmp_path / "ckpt").exists()


PADDING_IS_NEUTRAL = """
import json, sys
from pathlib import Path
import torch
from safetensors.torch import load_file
from kimideploy.config.specs import TrainSpec
from kimideploy.workloads import heldout, train
from kimideploy.workloads.vocab import load_vocab_maps
spec = TrainSpec.model_validate_json(Path(sys.argv[1]).read_text())
d2t, t2d = load_vocab_maps(Path(spec.vocab_dir), spec.target.vocab_size)
torch.manual_seed(0)
model = train.build_model(spec, d2t, t2d).eval()
saved = [load_file(str(p)) for p in sorted(Path(spec.hidden_states_dir).glob("shard-*/*.safetensors"))[:2]]
out = {}
for multiple in (1, 128):
    batch = heldout.pack(saved, spec.max_seq_len, "cpu", multiple=multiple)
    with torch.no_grad():
        _, loss, _ = model(**batch, ttt_steps=3, loss_config=train._loss_config("eager"))
    head = heldout.TargetHead(spec.target.path, 1e-6, "cpu")
    with torch.no_grad():
        judged = heldout.judge_batch(model, head, batch, 3)
    out[multiple] = {"length": batch["input_ids"].shape[1], "loss": float(loss), "judged": judged}
print(json.dumps(out))
"""


def test_packing_to_flex_attentions_block_changes_neither_the_loss_nor_the_judgement(
    tmp_path: Path, speculators_python: Path, tiny_model: Path, features: Path
) -> None:
    """On a GPU packs are padded to a multiple of 128 (FlexAttention's block; an H200 refused
    the unpadded length at the first step). The padding is a document of its own with no loss."""
    spec = train_spec(tmp_path, features, tiny_model)
    done = subprocess.run([str(speculators_python), "-c", PADDING_IS_NEUTRAL, str(spec)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    plain, padded = out["1"], out["128"]
    assert padded["length"] % 128 == 0 and padded["length"] > plain["length"]
    assert padded["loss"] == pytest.approx(plain["loss"], rel=1e-5)
    assert padded["judged"] == plain["judged"]


def test_a_multi_node_run_measures_its_allreduce_before_the_first_step(
    tmp_path: Path, speculators_python: Path, tiny_model: Path, features: Path
) -> None:
    """Two ranks (gloo here, NCCL on the clusters): the all-reduce across them runs before any
    step, its bus bandwidth is reported, and a figure below the cluster's floor stops the run
    with the reason (exit 2: retrying on the same fabric would not help)."""
    fast = train_spec(tmp_path / "ok", features, tiny_model, epochs=1, batch_size=1,
                      network_check={"min_bus_gbps": 1e-6})  # fmt: skip
    ranks = two_ranks(speculators_python, fast)
    stdout, stderr = ranks.communicate(timeout=600)
    assert ranks.returncode == 0, stderr[-3000:]
    [network] = events(stdout, "network")
    assert (
        network["ranks"] == 2 and network["bus_gbps"] > 0 and network["transports"] == [None, None]
    )
    slow = train_spec(tmp_path / "slow", features, tiny_model, epochs=1, batch_size=1,
                      network_check={"min_bus_gbps": 1e6})  # fmt: skip
    ranks = two_ranks(speculators_python, slow)
    stdout, stderr = ranks.communicate(timeout=600)
    assert ranks.returncode != 0
    assert "below network.min_bus_gbps 1e+06" in stderr
    assert events(stdout, "progress") == []
