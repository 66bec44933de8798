"""What a finished training run hands over: the drafter folder vLLM loads as it is (the best
checkpoint's weights, the config vLLM reads at its top level), the lineage that says what it was
trained on and how it was judged, and the held-out conversations `drafter doctor` replays. The
folder is written aside and renamed in; a drafter already there is moved aside, never replaced.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kimideploy.config.specs import TrainSpec
from kimideploy.formats.drafter_files import LINEAGE_FILE
from kimideploy.workloads import replay_sample, train_checkpoints
from kimideploy.workloads.runtime import atomic_write, emit, log
from kimideploy.workloads.train_features import Features
from kimideploy.workloads.train_judge import Best


@dataclass(frozen=True)
class Selection:
    """The checkpoint whose weights become the drafter, and why."""

    step: int
    reason: str
    held_out_length: float | None = None

    def record(self) -> dict[str, Any]:
        chosen: dict[str, Any] = {"step": self.step}
        if self.held_out_length is not None:
            chosen["held_out_length"] = self.held_out_length
        chosen["reason"] = self.reason
        return chosen


def select(best: Best | None, *, last_step: int, held_out_fraction: float) -> Selection:
    """The best checkpoint by held-out mean acceptance length at the serving k; the last step
    when nothing was judged."""
    if best is None:
        return Selection(
            last_step,
            "the last step: no held-out samples to judge on "
            f"(train.held_out_fraction {held_out_fraction})",
        )
    if best.step == last_step:
        return Selection(
            best.step,
            f"the last step has the best held-out mean acceptance length at k={best.k} "
            f"({best.length})",
            best.length,
        )
    return Selection(
        best.step,
        f"step {best.step} has the best held-out mean acceptance length at k={best.k} "
        f"({best.length}); the last step ({last_step}) had {best.latest_length}",
        best.length,
    )


@dataclass(frozen=True, kw_only=True)
class Handover:
    """What the run's last step knows that the drafter's files record."""

    spec: TrainSpec
    features: Features
    split: dict[str, Any]
    """heldout.Split.record: which samples were held out."""
    held_out: list[int]
    world: int
    tokens: int
    steps: int


def write_drafter(
    model: Any,
    handover: Handover,
    *,
    selection: Selection,
    held_out: dict[str, Any] | None,
    figures: dict[str, Any],
) -> Path:
    """The drafter folder at spec.output_dir, from `model` as it is (the caller loaded the
    selected checkpoint's weights); returns its path."""
    spec = handover.spec
    out = Path(spec.output_dir)
    tmp = out.with_name(f".{out.name}.tmp-{spec.run_id}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    config_path = tmp / "config.json"
    config = json.loads(config_path.read_text())
    # vLLM reads these at the top level; speculators writes them there, made certain here.
    config["eagle_aux_hidden_state_layer_ids"] = list(spec.layers.vllm_ids)
    config["draft_vocab_size"] = spec.draft_vocab_size
    methods = config["speculators_config"]["proposal_methods"]
    methods[0]["speculative_tokens"] = spec.num_speculative_tokens
    atomic_write(config_path, json.dumps(config, indent=2, sort_keys=True).encode())
    written = lineage(handover, selection=selection, held_out=held_out, figures=figures)
    written["replay_sample"] = write_replay_sample(handover, tmp)
    atomic_write(tmp / LINEAGE_FILE, json.dumps(written, indent=2).encode())
    if out.exists():  # never overwrite a drafter: the previous one moves aside
        aside = out.with_name(f"{out.name}.previous-{datetime.now(UTC):%Y%m%dT%H%M%S}")
        out.rename(aside)
        log(f"moved the previous {out} to {aside}")
    tmp.rename(out)
    emit(
        {
            "event": "result",
            "stage": "train",
            "drafter": spec.drafter,
            "output_dir": str(out),
            "steps": handover.steps,
            "selected": selection.record(),
            "held_out": held_out,
            "num_speculative_tokens": spec.num_speculative_tokens,
            **figures,
        }
    )
    log(f"wrote drafter {spec.drafter} (step {selection.step}) to {out}")
    return out


def load_selected(model: Any, spec: TrainSpec, selection: Selection, last_step: int) -> None:
    """The selected checkpoint's weights into `model`, when it is not the last step."""
    if selection.step == last_step:
        return
    path = train_checkpoints.step_dir(Path(spec.checkpoint_dir), selection.step)
    train_checkpoints.load_weights(path, model)
    log(f"writing the drafter of {selection.reason}")


def write_replay_sample(handover: Handover, folder: Path) -> dict[str, Any] | None:
    """The judged held-out conversations, with the token ids training rendered them to, for
    `drafter doctor` to replay on the serving engine wherever the drafter goes."""
    spec, features = handover.spec, handover.features
    where = spec.conversations_dir or (spec.online.conversations_dir if spec.online else None)
    if not handover.held_out or where is None:
        return None
    features.prefetch(handover.held_out)
    rendered = {}
    for index in handover.held_out:
        saved = features.load(index)
        rendered[features.sample_id(index)] = (
            [int(i) for i in saved["input_ids"].tolist()],
            [int(m) for m in saved["loss_mask"].tolist()],
        )
    rows = replay_sample.write(folder, Path(where), rendered)
    log(f"replay sample: {rows} held-out conversations written beside the drafter")
    return {
        "file": replay_sample.REPLAY_SAMPLE_FILE,
        "conversations": rows,
        "rendering": features.rendering(),
    }


def lineage(
    handover: Handover,
    *,
    selection: Selection,
    held_out: dict[str, Any] | None,
    figures: dict[str, Any],
) -> dict[str, Any]:
    """kimideploy.drafter-lineage.v1: what the drafter was trained for and on, how it was judged
    and which checkpoint it is."""
    from importlib.metadata import version

    spec = handover.spec
    spec_json = spec.model_dump_json()
    return {
        "kind": "kimideploy.drafter-lineage.v1",
        "drafter": spec.drafter,
        "run_id": spec.run_id,
        "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "trained_for": spec.target.repo,
        "trained_for_revision": spec.target.revision,
        "eagle_aux_hidden_state_layer_ids": list(spec.layers.vllm_ids),
        "layer_id_convention": "vllm",
        "written_as": {"ids": spec.layers.ids, "convention": spec.layers.convention},
        "draft_vocab_size": spec.draft_vocab_size,
        "num_speculative_tokens": spec.num_speculative_tokens,
        "ttt_steps": spec.ttt_steps,
        "base_drafter": spec.base_drafter_path,
        "dataset": {**handover.features.lineage(), "held_out": handover.split},
        "vocab": spec.vocab_dir,
        "config_sha256": hashlib.sha256(spec_json.encode()).hexdigest(),
        "speculators_version": version("speculators"),
        "world_size": handover.world,
        "selected_checkpoint": selection.record(),
        "held_out": held_out,
        "metrics": {**figures, "epochs": spec.epochs, "tokens": handover.tokens},
    }
