"""train: an EAGLE-3 drafter with the pinned speculators release, on the target's hidden states:
stored by `run extract` (offline) or computed on request by a vLLM server in the pod (online,
see train_features.py).

The model, its loss and its per-position accuracy are speculators' own (Eagle3DraftModel built the
way `speculators train` builds it); the loop around it is ours, because it must keep the promises
of every workload here: refuse wrong features before spending GPU time, checkpoint atomically every
N steps and at each epoch end, resume a restarted pod at the step it stopped (same data order,
same optimizer state), drain on SIGTERM (exit 75), and write a drafter vLLM loads as it is, with a
lineage file that says what it was trained on.

The run is four parts, each its own module: the ranks and their collectives (train_ranks.py),
the held-out judge and the best checkpoint (train_judge.py), the checkpoints and resuming
(train_checkpoints.py), and the drafter's folder and lineage (train_writer.py); this module is
the loop that steps the optimizer and calls them.

kimideploy's launcher (workloads/launch.py) starts one process per GPU; several nodes get their
rank from the Indexed Job and meet at index 0 through the headless Service (see plan/jobs.py). One
process (RANK unset) runs on CPU.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kimideploy.config.fingerprints import fingerprint_id
from kimideploy.config.specs import TrainSpec
from kimideploy.workloads import dataset_record, heldout, train_data, train_loader, train_writer
from kimideploy.workloads.runtime import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    BadInputError,
    Stopper,
    emit,
    log,
)
from kimideploy.workloads.train_checkpoints import Checkpoints, Position
from kimideploy.workloads.train_features import Features, ServerUnavailableError, open_features
from kimideploy.workloads.train_judge import Best, HeldOutJudge, next_best
from kimideploy.workloads.train_ranks import Collectives, Ranks
from kimideploy.workloads.train_schedule import build_scheduler
from kimideploy.workloads.vocab import load_vocab_maps


def run(spec: TrainSpec) -> int:
    ranks = Ranks.from_environment()
    try:
        features = open_features(spec)
    except ServerUnavailableError as exc:
        # A server that never loaded is counted against the Job's retries (exit 1); one that
        # loaded and dropped later is waited for, then retried without counting (below).
        log(f"error: {exc}")
        return EXIT_FAILED
    try:
        ids = [features.sample_id(i) for i in range(features.samples)]
        split = heldout.split_samples(ids, spec.held_out_fraction, spec.held_out_max_samples)
        steps = train_data.steps_per_epoch(len(split.train), ranks.world, spec.batch_size)
        if steps == 0:
            source = "extract" if spec.mode == "offline" else "generate"
            raise BadInputError(
                f"{len(split.train)} training samples ({len(split.held_out)} more held out) "
                f"cannot fill one batch of {spec.batch_size} on each of {ranks.world} ranks; "
                f"lower train.batch_size or {source} more samples"
            )
        _same_conversations(spec)
        d2t, t2d = load_vocab_maps(Path(spec.vocab_dir), spec.target.vocab_size)
        if len(d2t) != spec.draft_vocab_size:
            raise BadInputError(
                f"the vocab maps in {spec.vocab_dir} have {len(d2t)} draft tokens, drafter "
                f"{spec.drafter} wants {spec.draft_vocab_size}; run `kimideploy run vocab` again"
            )
        return TrainingLoop(
            spec, features, ranks, split, vocab=(d2t, t2d), steps_per_epoch=steps
        ).run()
    except ServerUnavailableError as exc:
        log(f"error: {exc}")
        log(
            f"exit {EXIT_INTERRUPTED}: the Job starts this pod again, which waits for its server "
            "and resumes from the last checkpoint"
        )
        return EXIT_INTERRUPTED
    except PeerRankStoppedError as exc:
        log(f"error: {exc}")
        return EXIT_INTERRUPTED
    finally:
        features.close()


class PeerRankStoppedError(Exception):
    """A collective failed: another rank left (its server gone for good, its node lost). Every
    rank exits with the retry code, the Job starts them all again, and they resume together from
    the last checkpoint."""


def _same_conversations(spec: TrainSpec) -> None:
    """The vocab maps must come from the conversations the features (or the online run) use."""
    vocab = dataset_record.require(Path(spec.vocab_dir), "vocab maps", {})
    made_from = (vocab.get("fields") or {}).get("conversations")
    wanted = spec.data_fingerprint.get("conversations") or fingerprint_id(spec.data_fingerprint)
    if spec.data_fingerprint and made_from != wanted:
        raise BadInputError(
            f"{spec.vocab_dir}: the vocab maps were counted on conversations {made_from}, this run "
            f"trains on conversations {wanted}",
            hint="run `kimideploy run vocab` for these conversations first",
        )


@dataclass(frozen=True)
class StepFigures:
    """What the loop reports after each step: printed as progress, stored with each checkpoint,
    written into the result event and the lineage's metrics."""

    step: int
    epoch: int
    loss: float | None
    """None where the step's loss was not finite (the step was skipped)."""
    lr: float
    accuracy_per_position: list[float]
    tokens_per_s: float
    step_s: float
    """The last step alone (forward, backward, optimizer; not the wait for its batch): comparable
    across precisions and data sources where the rate above is not."""
    grad_norm: float | None = None
    """The gradient norm before clipping to 1.0; None where it was not finite."""
    skipped_steps: int = 0
    """Steps skipped so far because a rank's loss or gradient norm was not finite."""
    held_out_length: float | None = None
    """The latest held-out mean acceptance length at the serving k, once one was judged."""

    def as_dict(self) -> dict[str, Any]:
        figures = asdict(self)
        if self.held_out_length is None:
            del figures["held_out_length"]
        return figures


class TrainingLoop:
    """The optimizer's steps over the epochs' batches, from wherever a checkpoint left them."""

    def __init__(
        self,
        spec: TrainSpec,
        features: Features,
        ranks: Ranks,
        split: heldout.Split,
        *,
        vocab: tuple[Any, Any],
        steps_per_epoch: int,
    ) -> None:
        import torch

        self.spec, self.features, self.ranks, self.split = spec, features, ranks, split
        self.steps_per_epoch = steps_per_epoch
        self.total_steps = steps_per_epoch * spec.epochs
        self.collectives = Collectives(spec, ranks)
        self.device = self.collectives.device
        torch.manual_seed(spec.seed)
        # fp32 master weights whatever the base drafter was saved in; bf16 comes from autocast.
        d2t, t2d = vocab
        self.model = build_model(spec, d2t, t2d).to(self.device, dtype=torch.float32)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        # The base drafter's weights as loaded, before any checkpoint is resumed over them.
        self.anchor = (
            [(p, p.detach().clone()) for p in trainable]
            if spec.anchor_weight and spec.base_drafter_path
            else []
        )
        self.optimizer = torch.optim.AdamW(trainable, lr=spec.lr, weight_decay=spec.weight_decay)
        self.scheduler = build_scheduler(self.optimizer, self.total_steps, spec)
        self.loss_config = _loss_config(spec.loss_implementation)
        self.stopper = Stopper()
        self.position = Position()
        self.best: Best | None = None
        self.judge = HeldOutJudge(spec, features, split.held_out, self.collectives)
        self.checkpoints = Checkpoints(
            spec,
            leader=ranks.leader,
            split=split.record,
            dataset=features.lineage().get("fingerprint"),
        )

    def run(self) -> int:
        import torch.distributed as dist

        try:
            return self._run()
        except dist.DistError as exc:
            raise PeerRankStoppedError(
                f"a collective with the other ranks failed ({type(exc).__name__}: "
                f"{str(exc)[:300]}); exit {EXIT_INTERRUPTED}: every rank is started again and "
                "resumes from the last checkpoint"
            ) from exc

    def _run(self) -> int:
        import torch

        self._resume()
        model = self.collectives.wrap(self.model)
        started, start_step, start_tokens = time.monotonic(), self.position.step, 0
        last: StepFigures | None = None
        while self.position.epoch < self.spec.epochs:
            order = train_data.epoch_order(
                self.split.train,
                self.spec.seed,
                self.position.epoch,
                self.ranks.rank,
                world=self.ranks.world,
            )
            batches = list(train_data.batches(order, self.spec.batch_size))
            todo = batches[self.position.step_in_epoch :]
            packed = train_loader.packed_batches(
                self.features,
                todo,
                max_seq_len=self.spec.max_seq_len,
                dtype=heldout.feature_dtype(self.spec.precision),
                device=self.device,
                workers=self.spec.loader_workers,
            )
            for batch in packed:
                step_started = time.perf_counter()
                model.train()
                with heldout.autocast(self.device, self.spec.precision):
                    _, loss, metrics = model(
                        **batch,
                        ttt_steps=self.spec.ttt_steps,
                        ttt_step_loss_decay=self.spec.ttt_step_loss_decay,
                        loss_config=self.loss_config,
                    )
                if self.anchor:
                    loss = loss + self.spec.anchor_weight * anchor_distance(self.anchor)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                lr = self.scheduler.get_last_lr()[0]
                # Read before the optimizer moves (a wait for the backward on a GPU): a step whose
                # loss or gradient norm is not finite would write NaN into every weight, on every
                # rank at the next all-reduce, and no later step recovers from it.
                loss_value, grad_norm = float(loss.detach()), float(norm)
                if self.collectives.all_finite(loss_value, grad_norm):
                    self.optimizer.step()
                else:
                    self.optimizer.zero_grad(set_to_none=True)
                    self.position.skipped_steps += 1
                    log(
                        f"step {self.position.step + 1}: loss {loss_value:g}, gradient norm "
                        f"{grad_norm:g} on this rank; not finite on a rank: skipped on every rank "
                        f"({self.position.skipped_steps} skipped so far)"
                    )
                # The schedule follows the batches, skipped or not: a resumed run restores it at
                # the step its position says.
                self.scheduler.step()
                tokens = int(batch["input_ids"].shape[1]) * self.ranks.world
                self.position.step += 1
                self.position.step_in_epoch += 1
                self.position.tokens += tokens
                start_tokens += tokens
                step_s = time.perf_counter() - step_started
                elapsed = max(time.monotonic() - started, 1e-6)
                last = StepFigures(
                    step=self.position.step,
                    epoch=self.position.epoch + 1,
                    loss=round(loss_value, 6) if math.isfinite(loss_value) else None,
                    lr=float(f"{lr:.6g}"),
                    grad_norm=round(grad_norm, 6) if math.isfinite(grad_norm) else None,
                    skipped_steps=self.position.skipped_steps,
                    accuracy_per_position=[
                        round(a, 4) for a in per_position_accuracy(metrics, self.spec.ttt_steps)
                    ],
                    tokens_per_s=round(start_tokens / elapsed, 1),
                    step_s=round(step_s, 4),
                    held_out_length=self.best.latest_length if self.best else None,
                )
                self._report(last, (self.position.step - start_step) / elapsed)
                if self.position.step % self.spec.checkpoint_every_steps == 0:
                    self._checkpoint(last)
                if self.collectives.should_stop(self.stopper):
                    packed.close()  # stops the loader's workers before the checkpoint
                    self._checkpoint(last)  # every rank stops here; it ends at a barrier
                    self.collectives.close()
                    log(f"stopped at step {self.position.step}; a restarted pod resumes there")
                    return EXIT_INTERRUPTED
            self.position.epoch += 1
            self.position.step_in_epoch = 0
            self._checkpoint(last)
        if self.ranks.leader:
            self._write_drafter(last)
        self.collectives.barrier()
        self.collectives.close()
        return EXIT_OK

    def _report(self, figures: StepFigures, rate: float) -> None:
        if not self.ranks.leader:
            return
        remaining = self.total_steps - self.position.step
        emit(
            {
                "event": "progress",
                "stage": "train",
                "done": self.position.step,
                "total": self.total_steps,
                "unit": "steps",
                "rate": round(rate, 4),
                "eta_s": round(remaining / rate, 1) if rate > 0 else None,
                **figures.as_dict(),
            }
        )

    def _checkpoint(self, figures: StepFigures | None) -> None:
        """Judged on the held-out samples (once per step), then written by rank 0."""
        judged = None
        if not self.checkpoints.written(self.position.step):
            judged = self.judge.judge(self.model)
            if judged is not None:
                self._consider(judged)
        final = self.checkpoints.save(
            self.model,
            self.optimizer,
            self.scheduler,
            position=self.position,
            record={
                "metrics": figures.as_dict() if figures else {},
                "held_out": judged,
                "best": self.best.record() if self.best else None,
                "world": self.ranks.world,
            },
            best_step=self.best.step if self.best else None,
        )
        if final is not None:
            emit(
                {
                    "event": "checkpoint",
                    "stage": "train",
                    "step": self.position.step,
                    "path": str(final),
                    "held_out_length": self.best.latest_length if self.best else None,
                }
            )
        self.collectives.barrier()

    def _consider(self, judged: dict[str, Any]) -> None:
        k = self.spec.num_speculative_tokens
        self.best = best = next_best(self.best, judged, step=self.position.step, k=k)
        emit(
            {
                "event": "evaluation",
                "stage": "train",
                "step": self.position.step,
                "held_out": judged,
                "best_step": best.step,
                "best_length": best.length,
            }
        )
        log(
            f"step {self.position.step}: held-out mean acceptance length "
            + ", ".join(f"k={kk} {v}" for kk, v in judged["mean_acceptance_length"].items())
            + f" (best at k={k}: {best.length} at step {best.step})"
        )

    def _resume(self) -> None:
        resumed = self.checkpoints.resume(
            self.model, self.optimizer, self.scheduler, device=self.device
        )
        if resumed is None:
            log(f"starting at step 0 ({self.total_steps} steps, {self.spec.epochs} epochs)")
            return
        self.position, self.best = resumed.position, Best.from_record(resumed.best)
        log(f"resuming from {resumed.source} at step {self.position.step} of {self.total_steps}")
        if self.ranks.leader:
            emit(
                {
                    "event": "resumed",
                    "stage": "train",
                    "step": self.position.step,
                    "epoch": self.position.epoch + 1,
                    "from": str(resumed.source),
                }
            )

    def _write_drafter(self, figures: StepFigures | None) -> None:
        last = self.position.step
        selection = train_writer.select(
            self.best, last_step=last, held_out_fraction=self.spec.held_out_fraction
        )
        train_writer.load_selected(self.model, self.spec, selection, last)
        handover = train_writer.Handover(
            spec=self.spec,
            features=self.features,
            split=self.split.record,
            held_out=self.split.held_out,
            world=self.ranks.world,
            tokens=self.position.tokens,
            steps=last,
        )
        train_writer.write_drafter(
            self.model,
            handover,
            selection=selection,
            held_out=self.checkpoints.held_out_of(selection.step),
            figures=figures.as_dict() if figures else {},
        )


def per_position_accuracy(metrics: dict[str, Any], positions: int) -> list[float]:
    """speculators' conditional accuracy per draft position: correct given all earlier correct,
    the training-time counterpart of vLLM's per-position acceptance."""
    out = []
    for i in range(positions):
        total = float(metrics.get(f"cond_acc_{i}_total", 0))
        out.append(float(metrics.get(f"cond_acc_{i}_sum", 0)) / total if total else 0.0)
    return out


def _loss_config(implementation: str) -> Any:
    """speculators' KL loss; its fused kernels need a GPU (and a compiler that takes them)."""
    import torch
    from speculators.losses import resolve_loss_config

    fused = implementation == "fused" and torch.cuda.is_available()
    return resolve_loss_config("kl_div", "fused" if fused else "eager")


def anchor_distance(anchor: list[tuple[Any, Any]]) -> Any:
    """The sum of squared differences from the base drafter's weights (L2-SP)."""
    return sum(((weight - base) ** 2).sum() for weight, base in anchor)


def build_model(spec: TrainSpec, d2t: Any, t2d: Any) -> Any:
    """From a base drafter (fine-tuning) or from scratch, the way `speculators train` builds one."""
    import torch
    from speculators.models.eagle3.core import Eagle3DraftModel

    attention = "simple_flex_attention" if torch.cuda.is_available() else "eager"
    if spec.base_drafter_path:
        base = Path(spec.base_drafter_path)
        try:
            model = heldout.load_drafter(str(base), attention, spec.target.path)
        except (OSError, ValueError, KeyError) as exc:
            raise BadInputError(
                f"base drafter {base} is not a speculators EAGLE-3 checkpoint ({exc}); convert it "
                "with `speculators convert` or train from scratch (train.base_drafter: null)"
            ) from exc
        written = list(model.config.eagle_aux_hidden_state_layer_ids or [])
        if written != list(spec.layers.vllm_ids):
            raise BadInputError(
                f"base drafter {base} reads layers {written} (vLLM's convention), the dataset and "
                f"drafter {spec.drafter} use {spec.layers.vllm_ids}; fine-tuning cannot change them"
            )
        if model.config.draft_vocab_size != spec.draft_vocab_size:
            raise BadInputError(
                f"base drafter {base} has a draft vocabulary of {model.config.draft_vocab_size}, "
                f"drafter {spec.drafter} wants {spec.draft_vocab_size}"
            )
        return model
    from speculators.train.cli import create_transformer_layer_config

    layer_config = create_transformer_layer_config(
        spec.target.path, spec.draft_layers, "llama", None, 0, list(range(spec.draft_layers))
    )
    return Eagle3DraftModel.from_training_args(
        layer_config,
        t2d=t2d,
        d2t=d2t,
        target_layer_ids=list(spec.layers.vllm_ids),
        draft_vocab_size=spec.draft_vocab_size,
        norm_before_residual=True,
        ttt_steps=spec.ttt_steps,
        verifier_name_or_path=spec.target.path,
        draft_attn_impl=attention,
    )


__all__ = ["EXIT_BAD_INPUT", "run"]
