"""replay-judge: each drafter judged offline on what replay-capture captured, with training's
held-out computation (heldout.py: the drafter drafting on its own drafts, greedy verification by
the target's head over the full vocabulary, greedy speculative decoding's walk at every k).

The container after replay-capture, on the cluster's train image (speculators). Per drafter, a
chain of scenarios, each changing one thing from the one before, so a drop between two of them
has one cause:

- as trained: the held-out figures training recorded (its lineage; not recomputed here);
- served_features: the same conversations, training's token ids and layer ids, the features the
  served engine computes (target, revision, variant, quantization, engine);
- served_rendering: the conversations rendered by the served template and tokenizer;
- served_layers: the layers serving feeds the drafter, where they differ from training's;
- served_answers: the conversations' prompts answered by the served target (what serving drafts
  on, for the prompts training judged on);
- prompts:NAME: the user's prompts answered by the served target;
- layers -1 / +1: served_answers (else the first prompt set) with every layer id shifted, the
  other convention in either direction.

Where two scenarios judge the same turns with different layers (the layers training fed against
the ones serving feeds; the served ones against each shift), the result also carries the paired
difference at the served k with its 95% interval (heldout.paired_difference): the convention
mistake can cost a few hundredths of a token per step, which only a paired comparison resolves.

The result carries every scenario's figures (per k: mean acceptance length, per-position
acceptance) and how often the target head's choice equals the token the engine generated (a
check that the capture is the served target's greedy text).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kimideploy.config.specs import ReplayDrafter, ReplaySpec
from kimideploy.formats.drafter_files import LINEAGE_FILE
from kimideploy.workloads import heldout
from kimideploy.workloads.replay_capture import index_file
from kimideploy.workloads.runtime import EXIT_OK, BadInputError, emit, log

MAX_DEPTH = 8
EXTRA_DEPTH = 2
"""Judged this many positions beyond the served k (up to MAX_DEPTH): whether a deeper k pays."""


def judged_depth(k: int) -> int:
    return min(max(k + EXTRA_DEPTH, 1), MAX_DEPTH)


def run(spec: ReplaySpec) -> int:
    import torch

    root = Path(spec.capture_dir)
    path = index_file(root, spec.run_id)
    if not path.is_file():
        raise BadInputError(
            f"{path} is missing: replay-capture did not finish for run {spec.run_id}",
            hint="the capture container's log says why",
        )
    record = json.loads(path.read_text())
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    judged: dict[str, Any] = {}
    head: heldout.TargetHead | None = None
    for drafter in spec.drafters:
        model = _load_drafter(drafter, spec.target.path, device)
        if head is None:
            eps = float(model.config.transformer_layer_config.rms_norm_eps)
            head = heldout.TargetHead(spec.target.path, eps, device)
        judge = Judge(spec, root, record["requests"], model, head=head, device=device)
        judged[drafter.name] = judge.drafter(drafter, record.get("rendering", {}))
        log(
            f"judged {drafter.name}: "
            + ", ".join(
                f"{name} {figures['mean_acceptance_length'][str(drafter.num_speculative_tokens)]}"
                for name, figures in judged[drafter.name]["scenarios"].items()
            )
        )
    emit(
        {
            "event": "result",
            "stage": "replay",
            "drafters": judged,
            "capture": {
                key: record.get(key) for key in ("engine", "image", "note", "renderer_agreement")
            },
        }
    )
    return EXIT_OK


def _load_drafter(drafter: ReplayDrafter, target: str, device: Any) -> Any:
    import torch

    # Flex attention on a GPU, as training judges there; its backward is not needed here, but
    # its CPU path is missing, so eager masks on a CPU.
    attention = "simple_flex_attention" if torch.cuda.is_available() else "eager"
    try:
        model = heldout.load_drafter(drafter.path, attention, target)
    except (OSError, ValueError, KeyError) as exc:
        raise BadInputError(
            f"drafter {drafter.name} at {drafter.path} is not a speculators EAGLE-3 checkpoint "
            f"({exc}); the replay judges with speculators' modules",
            hint="convert it with `speculators convert`",
        ) from exc
    return model.to(device).eval()


def read_lineage(drafter: ReplayDrafter) -> dict[str, Any]:
    path = Path(drafter.path) / LINEAGE_FILE
    if not path.is_file():
        return {}
    try:
        loaded = json.loads(path.read_text())
    except ValueError:
        log(f"{path} is not JSON: judged without its lineage")
        return {}
    return loaded if isinstance(loaded, dict) else {}


def trained_layer_ids(lineage: dict[str, Any], model: Any) -> tuple[list[int], str]:
    """The layers training fed the drafter, and where that is known from."""
    ids = lineage.get("eagle_aux_hidden_state_layer_ids")
    if ids:
        return [int(i) for i in ids], "its lineage file"
    written = list(model.config.eagle_aux_hidden_state_layer_ids or [])
    return [int(i) for i in written], "its config.json (no lineage file)"


class Judge:
    def __init__(
        self,
        spec: ReplaySpec,
        root: Path,
        requests: dict[str, Any],
        model: Any,
        *,
        head: heldout.TargetHead,
        device: Any,
    ) -> None:
        self.spec, self.root, self.requests = spec, root, requests
        self.model, self.head, self.device = model, head, device
        self.turns: dict[tuple[str, tuple[int, ...]], list[list[int]]] = {}

    def drafter(self, drafter: ReplayDrafter, rendering: dict[str, Any]) -> dict[str, Any]:
        lineage = read_lineage(drafter)
        trained, known_from = trained_layer_ids(lineage, self.model)
        served = list(drafter.served_layer_ids)
        depth = judged_depth(drafter.num_speculative_tokens)
        scenarios: dict[str, Any] = {}
        agreement: dict[str, int] = {"positions": 0, "same": 0}
        name = drafter.name
        if self._group(f"trained:{name}"):
            scenarios["served_features"] = self.judge(f"trained:{name}", trained, depth)
            scenarios["served_rendering"] = self.judge(f"rendered:{name}", trained, depth)
            if served != trained:
                scenarios["served_layers"] = self.judge(f"rendered:{name}", served, depth)
            scenarios["served_answers"] = self.judge(f"answered:{name}", served, depth, agreement)
        for prompt_set in self.spec.prompt_sets:
            group = f"prompts:{prompt_set.name}"
            scenarios[group] = self.judge(group, served, depth, agreement)
        probe = (
            "answered:" + name
            if "served_answers" in scenarios
            else next((f"prompts:{p.name}" for p in self.spec.prompt_sets), None)
        )
        k = drafter.num_speculative_tokens
        shifts, shift_costs = {}, {}
        for delta in (-1, 1):
            moved = [i + delta for i in served]
            if probe and all(i in self.spec.layer_ids for i in moved):
                shifts[f"{delta:+d}"] = self.judge(probe, moved, depth)
                shift_costs[f"{delta:+d}"] = self.paired(probe, served, moved, k)
        layers: dict[str, Any] = {
            "served": served,
            "trained": trained,
            "trained_known_from": known_from,
        }
        if "served_layers" in scenarios:
            layers["cost"] = self.paired(f"rendered:{name}", trained, served, k)
        return {
            "num_speculative_tokens": k,
            "layers": layers,
            "scenarios": scenarios,
            "shifted": {"probe": _scenario_of(probe, name), "by": shifts, "paired": shift_costs},
            "rendering": rendering.get(name),
            "held_out": lineage.get("held_out"),
            "trained_for": {
                key: lineage.get(key) for key in ("trained_for", "trained_for_revision")
            },
            "head_agreement": round(agreement["same"] / agreement["positions"], 4)
            if agreement["positions"]
            else None,
        }

    def paired(self, group: str, base: list[int], other: list[int], k: int) -> dict[str, Any]:
        """What feeding `other` layers instead of `base` does to the same turns at the served k,
        with its paired 95% interval: a cost of a few hundredths is measurable this way."""
        return heldout.paired_difference(
            self.turns[(group, tuple(base))], self.turns[(group, tuple(other))], k
        )

    def _group(self, group: str) -> list[str]:
        return sorted(name for name in self.requests if name.startswith(group + "/"))

    def judge(
        self, group: str, layer_ids: list[int], depth: int, agreement: dict[str, int] | None = None
    ) -> dict[str, Any]:
        import torch
        from safetensors.torch import load_file

        rows = [self.spec.layer_ids.index(i) for i in layer_ids]
        names = self._group(group)
        per_turn: list[list[int]] = []
        with torch.no_grad():
            for first in range(0, len(names), self.spec.batch_size):
                saved = []
                for name in names[first : first + self.spec.batch_size]:
                    key = self.requests[name]["sequence"]
                    one = load_file(str(self.root / f"{key}.safetensors"))
                    one["aux_hidden_states"] = one["aux_hidden_states"][rows]
                    saved.append(one)
                batch = heldout.pack(
                    saved,
                    self.spec.max_seq_len,
                    self.device,
                    multiple=heldout.pack_multiple(self.device),
                )
                targets = self.head.greedy(batch["verifier_last_hidden_states"][0])
                if agreement is not None:
                    _agree(batch, targets, agreement)
                lengths = heldout.rollout(self.model, batch, depth, targets)
                per_turn += heldout.turns(lengths, batch)
        self.turns[(group, tuple(layer_ids))] = per_turn
        return heldout.figures(heldout.judge_turns(per_turn, depth), len(names))


def _agree(batch: dict[str, Any], targets: Any, agreement: dict[str, int]) -> None:
    """Position j's target choice is the token at j + 1 (speculators' shifted layout): on
    generated text it must be the token the engine generated there."""
    tokens, mask = batch["input_ids"][0], batch["loss_mask"][0].bool()
    docs = batch["document_ids"][0]
    same_doc = docs[1:] == docs[:-1]
    where = mask[1:] & same_doc
    agreement["positions"] += int(where.sum())
    agreement["same"] += int(((targets[:-1] == tokens[1:]) & where).sum())


def _scenario_of(probe: str | None, drafter: str) -> str | None:
    if probe is None:
        return None
    return "served_answers" if probe == f"answered:{drafter}" else probe
