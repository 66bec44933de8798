"""The held-out judge of a training run: the model as it is now, walked over the held-out turns the
way vLLM verifies drafts (heldout.py), its figures pooled across ranks; and which checkpoint is
the best so far by held-out mean acceptance length at the serving k.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kimideploy.config.specs import TrainSpec
from kimideploy.workloads import heldout
from kimideploy.workloads.train_features import Features
from kimideploy.workloads.train_ranks import Collectives


@dataclass(frozen=True)
class Best:
    """The best checkpoint so far, and the latest judgement (the last step's, for the printout).
    A checkpoint's state.json keeps it, so a resumed run goes on comparing against it."""

    step: int
    length: float
    k: int
    latest_length: float

    def record(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "length": self.length,
            "k": self.k,
            "latest_length": self.latest_length,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any] | None) -> Best | None:
        if not record:
            return None
        length = float(record["length"])
        return cls(
            step=int(record["step"]),
            length=length,
            k=int(record["k"]),
            latest_length=float(record.get("latest_length", length)),
        )


def next_best(best: Best | None, judged: dict[str, Any], *, step: int, k: int) -> Best:
    """`best` after the judgement `judged` of `step`: a longer acceptance at k takes its place,
    an equal one does not (the earliest of equals: fewer steps, same prediction)."""
    length = float(judged["mean_acceptance_length"][str(k)])
    if best is None or length > best.length:
        return Best(step=step, length=length, k=k, latest_length=length)
    return replace(best, latest_length=length)


class HeldOutJudge:
    """Judges the model on this rank's share of the held-out samples; the turns of every rank are
    pooled, so each rank returns the same figures."""

    def __init__(
        self,
        spec: TrainSpec,
        features: Features,
        held_out: list[int],
        collectives: Collectives,
    ) -> None:
        self.spec, self.features, self.held_out = spec, features, held_out
        self.collectives = collectives
        self.head: heldout.TargetHead | None = None

    def judge(self, model: Any) -> dict[str, Any] | None:
        """The held-out figures of `model` as it is now (heldout.figures); None without held-out
        samples. The model's training mode is left as it was."""
        import torch

        if not self.held_out:
            return None
        ranks, device = self.collectives.ranks, self.collectives.device
        mine = self.held_out[ranks.rank :: ranks.world]
        if self.head is None:
            eps = float(model.config.transformer_layer_config.rms_norm_eps)
            self.head = heldout.TargetHead(self.spec.target.path, eps, device)
        depth = self.spec.judged_depth
        per_turn: list[list[int]] = []
        was_training = model.training
        model.eval()
        with torch.no_grad(), heldout.autocast(device, self.spec.precision):
            for start in range(0, len(mine), self.spec.batch_size):
                ids = mine[start : start + self.spec.batch_size]
                self.features.prefetch(ids)
                per_turn += heldout.judge_batch(model, self.head, self._batch(ids), depth)
        model.train(was_training)
        per_turn = self.collectives.gather_turns(per_turn)
        walks = heldout.judge_turns(per_turn, depth)
        return heldout.figures(walks, len(self.held_out), per_turn)

    def _batch(self, sample_ids: list[int]) -> dict[str, Any]:
        """Samples packed into one sequence (document ids keep attention within a sample)."""
        device = self.collectives.device
        saved = [self.features.load(index) for index in sample_ids]
        dtype = heldout.feature_dtype(self.spec.precision)
        multiple = heldout.pack_multiple(device)
        return heldout.pack(saved, self.spec.max_seq_len, device, dtype, multiple=multiple)
