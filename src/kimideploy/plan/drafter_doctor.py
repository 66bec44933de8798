"""Why a drafter's acceptance is low: the doctor's verdict from a replay on the serving engine,
the held-out figures training recorded, and what vLLM counted where it serves.

The replay (workloads/replay_judge.py) judges the drafter along a chain of scenarios that each
change one thing from the one before: as trained (held-out figures) -> the served engine's
features of the same token ids -> the served template's rendering -> the layers serving feeds
-> the served target's own answers -> the user's prompts. A significant drop at one link names
its cause, with the two figures side by side and the fix. Two causes need no drop to be named:
layer ids that differ from the ones training recorded (the convention mistake is certain from
the records alone, whatever it costs on a given model), and a k whose last positions cost more
than they bring on this cluster (from the per-position acceptance and the cluster's step cost).

Pure: the CLI gathers the inputs (services/drafters/doctor.py) and prints the Diagnosis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kimideploy.plan.calibration import CostModel
from kimideploy.plan.speedup import tokens_per_step

ABSOLUTE_DROP = 0.15
RELATIVE_DROP = 0.05
"""A drop in mean acceptance length is a cause when it exceeds both 0.15 tokens per step and 5% of
the higher figure. Two judgements of the same conversations by the same drafter on two engines
differ by about 0.02 (CPU test target: 3.26 recorded vs 3.25 replayed for the correct drafter);
the smallest drop of a real cause measured there was the domain's (docs/usage/drafter-doctor.md)."""
MISMATCHES = ("convention", "target", "template")
"""Causes that make the drafter serve other inputs than it was trained on: while one stands,
neither k nor the drafter's strength can be judged."""
K_GAIN = 0.02
"""Another k is recommended when its predicted speedup beats the served k's by 2% or more."""

CAUSES = ("convention", "template", "target", "domain", "k", "weak")
"""Every cause the doctor names, in the order a user should fix them (a later cause's figures
are measured with the earlier ones still in place)."""


@dataclass(frozen=True)
class Finding:
    cause: str
    summary: str
    evidence: str
    fix: str
    drop: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "summary": self.summary,
            "evidence": self.evidence,
            "fix": self.fix,
            "drop": round(self.drop, 4),
        }


@dataclass(frozen=True)
class Measured:
    """What vLLM counted for the drafter where it serves (a stored bench run)."""

    mean_acceptance_length: float
    per_position: list[float]
    """Conditional acceptance per position (accepted given the positions before accepted)."""
    source: str


@dataclass(frozen=True)
class DoctorInputs:
    drafter: str
    cluster: str
    k: int
    replay: dict[str, Any]
    """The replay's result for this drafter (replay_judge.Judge.drafter)."""
    held_out: dict[int, float] | None
    held_out_per_position: list[float]
    costs: CostModel
    concurrency: int
    measured: Measured | None = None
    served_model: str = ""
    trained_for: str = ""
    prompt_set: str | None = None
    """The user's prompt set (`--prompts`); None: the doctor has the drafter's own sample only."""


@dataclass
class Diagnosis:
    drafter: str
    cluster: str
    k: int
    findings: list[Finding] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    prediction: dict[str, Any] = field(default_factory=dict)

    judged: bool = True
    """False when the replay had nothing to judge the drafter on and nothing was measured."""

    @property
    def healthy(self) -> bool:
        return self.judged and not self.findings

    @property
    def verdict(self) -> str:
        if not self.judged:
            return "inconclusive: nothing to judge it on (no replay sample, no prompts, no bench)"
        return "healthy" if self.healthy else "unhealthy: " + ", ".join(self.causes)

    @property
    def causes(self) -> list[str]:
        return [f.cause for f in self.findings]

    def as_dict(self) -> dict[str, Any]:
        return {
            "drafter": self.drafter,
            "cluster": self.cluster,
            "k": self.k,
            "verdict": self.verdict.split(":")[0],
            "causes": self.causes,
            "findings": [f.as_dict() for f in self.findings],
            "scenarios": self.rows,
            "prediction": self.prediction,
            "notes": self.notes,
        }


def significant(high: float, low: float) -> bool:
    drop = high - low
    return drop >= ABSOLUTE_DROP and drop >= RELATIVE_DROP * high


SCENARIO_TEXT = {
    "served_features": "the served engine's features of training's token ids",
    "served_rendering": "rendered by the served template",
    "served_layers": "the layers serving feeds it",
    "served_answers": "its prompts answered by the served target",
}


def paired_text(paired: dict[str, Any] | None) -> str:
    """A paired difference (heldout.paired_difference) as the user reads it: the change, its
    interval, and whether the interval excludes no change."""
    if not paired:
        return ""
    low, high = paired["ci95"]
    verdict = "measurable" if low > 0 or high < 0 else "within what chance gives"
    return (
        f" ({paired['difference']:+.3f} at k={paired['k']} over {paired['turns']} turns, 95% "
        f"interval {low:+.3f} to {high:+.3f}: {verdict})"
    )


def length_at(figures: dict[str, Any] | None, k: int) -> float | None:
    if not figures:
        return None
    value = (figures.get("mean_acceptance_length") or {}).get(str(k))
    return float(value) if value is not None else None


def per_position(figures: dict[str, Any] | None) -> list[float]:
    """Conditional acceptance per position at the deepest k judged."""
    if not figures:
        return []
    by_k = figures.get("by_k") or {}
    if not by_k:
        return []
    deepest = by_k[str(max(int(k) for k in by_k))]
    return [float(p) for p in deepest.get("acceptance_per_position") or []]


def diagnose(inputs: DoctorInputs) -> Diagnosis:
    k, replay = inputs.k, inputs.replay
    scenarios: dict[str, Any] = replay.get("scenarios") or {}
    result = Diagnosis(inputs.drafter, inputs.cluster, k)
    result.rows = _rows(inputs, scenarios)
    held = (inputs.held_out or {}).get(k)
    figures = {name: length_at(s, k) for name, s in scenarios.items()}
    findings: list[Finding] = []
    findings += _convention(inputs, replay, figures)
    findings += _target(inputs, held, figures.get("served_features"))
    findings += _template(inputs, replay, figures)
    findings += _domain(inputs, figures)
    k_finding, prediction = _depth(inputs, scenarios)
    if not any(f.cause in MISMATCHES for f in findings):
        findings += k_finding  # with a mismatch fixed, the per-position figures change
    result.prediction = prediction
    findings += _weak(inputs, scenarios, prediction, findings)
    order = {cause: i for i, cause in enumerate(CAUSES)}
    result.findings = sorted(findings, key=lambda f: order[f.cause])
    result.notes = _notes(inputs, replay, figures)
    if prediction.get("deeper"):
        result.notes.append(prediction["deeper"])
    result.judged = bool(scenarios) or inputs.measured is not None
    return result


def _rows(inputs: DoctorInputs, scenarios: dict[str, Any]) -> list[dict[str, Any]]:
    k = inputs.k
    rows = []
    if inputs.held_out:
        rows.append(
            {
                "scenario": "as_trained",
                "what": "held-out figures training recorded",
                "length": inputs.held_out.get(k),
                "per_position": inputs.held_out_per_position[:k],
            }
        )
    for name, figures in scenarios.items():
        what = SCENARIO_TEXT.get(name) or f"your prompts ({name.removeprefix('prompts:')})"
        rows.append(
            {
                "scenario": name,
                "what": what,
                "length": length_at(figures, k),
                "per_position": per_position(figures),
            }
        )
    for delta, figures in ((inputs.replay.get("shifted") or {}).get("by") or {}).items():
        probe = (inputs.replay.get("shifted") or {}).get("probe")
        rows.append(
            {
                "scenario": f"layers {delta}",
                "what": f"{probe}, every layer id {delta}",
                "length": length_at(figures, k),
                "per_position": per_position(figures),
            }
        )
    if inputs.measured is not None:
        rows.append(
            {
                "scenario": "measured",
                "what": inputs.measured.source,
                "length": inputs.measured.mean_acceptance_length,
                "per_position": inputs.measured.per_position,
            }
        )
    return rows


def _convention(
    inputs: DoctorInputs, replay: dict[str, Any], figures: dict[str, float | None]
) -> list[Finding]:
    layers = replay.get("layers") or {}
    served, trained = layers.get("served") or [], layers.get("trained") or []
    name = inputs.drafter
    if served and trained and served != trained:
        own, fed = figures.get("served_rendering"), figures.get("served_layers")
        cost = (
            f"; on the replay: {own:.2f} with its own layers, {fed:.2f} with the served ones"
            f"{paired_text(layers.get('cost'))}"
            if own is not None and fed is not None
            else ""
        )
        return [
            Finding(
                "convention",
                "serving feeds the drafter other layers than it was trained on",
                f"trained on vLLM layer ids {trained} ({layers.get('trained_known_from')}); "
                f"serving feeds {served}{cost}",
                f"set drafters.{name}.aux_layer_ids: {trained} with layer_id_convention: vllm (the "
                "ids it was trained with, in vLLM's convention)",
                (own or 0) - (fed or 0),
            )
        ]
    shifted = (replay.get("shifted") or {}).get("by") or {}
    probe = (replay.get("shifted") or {}).get("probe")
    paired = (replay.get("shifted") or {}).get("paired") or {}
    here = figures.get(probe) if probe else None
    for delta, moved in sorted(shifted.items()):
        value = length_at(moved, inputs.k)
        if here is not None and value is not None and significant(value, here):
            ids = [i + int(delta) for i in served]
            return [
                Finding(
                    "convention",
                    "the drafter accepts more with every layer id moved by "
                    f"{delta}: it was probably trained in the other convention",
                    f"{probe}: {here:.2f} with layers {served}, {value:.2f} with {ids}"
                    f"{paired_text(paired.get(delta))} (no lineage says which layers it was "
                    "trained on)",
                    f"set drafters.{name}.aux_layer_ids: {ids} with layer_id_convention: vllm",
                    value - here,
                )
            ]
    return []


def _target(inputs: DoctorInputs, held: float | None, served: float | None) -> list[Finding]:
    if held is None or served is None or not significant(held, served):
        return []
    drift = ""
    if inputs.trained_for and inputs.served_model and inputs.trained_for != inputs.served_model:
        drift = (
            f"; its record says it was trained for {inputs.trained_for}, {inputs.cluster} "
            f"serves {inputs.served_model}"
        )
    return [
        Finding(
            "target",
            "the served model's hidden states are not the ones it was trained on",
            f"held-out as trained {held:.2f}; the same token ids with the served engine's features "
            f"{served:.2f}{drift}",
            f"regenerate the data on the checkpoint {inputs.cluster} serves (`kimideploy run "
            "datagen`, `run extract` against it) and train again; or serve the checkpoint, "
            "variant and quantization it was trained for",
            held - served,
        )
    ]


def _template(
    inputs: DoctorInputs, replay: dict[str, Any], figures: dict[str, float | None]
) -> list[Finding]:
    before, after = figures.get("served_features"), figures.get("served_rendering")
    rendering = replay.get("rendering") or {}
    if before is None or after is None or not significant(before, after):
        return []
    where = rendering.get("first_difference") or ""
    return [
        Finding(
            "template",
            "the served template renders its conversations differently from training",
            f"{rendering.get('differ', '?')} of {rendering.get('conversations', '?')} "
            f"conversations render to other token ids ({where}); acceptance {before:.2f} as "
            f"training rendered them, {after:.2f} as the served template does",
            "train again on features rendered by the served tokenizer and template (`run extract` "
            "and `run train` with the served checkpoint's tokenizer), or serve with the template "
            "training used",
            before - after,
        )
    ]


def _domain(inputs: DoctorInputs, figures: dict[str, float | None]) -> list[Finding]:
    if inputs.prompt_set is None:
        return []
    own, yours = figures.get("served_answers"), figures.get(f"prompts:{inputs.prompt_set}")
    if own is None or yours is None or not significant(own, yours):
        return []
    return [
        Finding(
            "domain",
            "your prompts are not like the ones it was trained on",
            f"{own:.2f} on prompts like its training data, {yours:.2f} on yours "
            f"({inputs.prompt_set}), both answered by the served target",
            "collect prompts of your kind, put them into clusters."
            f"{inputs.cluster}.workloads.datagen.prompts and run the pipeline again (datagen, "
            "extract, vocab, train)",
            own - yours,
        )
    ]


BASIS_REPLAY = "conditional, replay walk"
"""Per-position acceptance from the replay: accepted at i given accepted before i, over the draft
starts greedy decoding makes at the deepest k judged."""
BASIS_BENCH = "per draft, vLLM's counters"
"""Per-position acceptance vLLM counted while serving another prompt set (a stored bench run)."""


def _depth(inputs: DoctorInputs, scenarios: dict[str, Any]) -> tuple[list[Finding], dict[str, Any]]:
    """Predicted speedup at each k on the prompts replayed (the user's, else the drafter's own
    answered by the served target): at each k the replay judged, the replay's own figure for that
    k, the one the engine tests prove (the walk at k starts its drafts where greedy decoding at k
    does); deeper, rebuilt from the deepest per-position rates. What vLLM counted on another prompt
    set (a stored bench run) is shown beside it, labelled, never in its place."""
    replayed_name = (
        f"prompts:{inputs.prompt_set}"
        if inputs.prompt_set
        else "served_answers"
        if "served_answers" in scenarios
        else None
    )
    figures = scenarios.get(replayed_name) if replayed_name else None
    rates = per_position(figures)
    judged = {
        int(k): float(v) for k, v in ((figures or {}).get("mean_acceptance_length") or {}).items()
    }
    if not rates and not judged:
        return [], _measured_beside(inputs, {})
    k, c = inputs.k, inputs.concurrency
    predicted: dict[int, tuple[float, float, str]] = {}
    for depth in range(1, max(len(rates), max(judged, default=0)) + 1):
        basis = "replay at this k" if depth in judged else "rebuilt from the replay's rates"
        length = judged.get(depth) or tokens_per_step(rates[:depth])
        predicted[depth] = (length, length / inputs.costs.cost(depth, c), basis)
    served = predicted.get(k)
    best = max(predicted, key=lambda d: predicted[d][1])
    prediction = {
        "per_position": [round(r, 4) for r in rates],
        "per_position_basis": BASIS_REPLAY,
        "source": f"replay ({replayed_name})",
        "concurrency": c,
        "cost_source": inputs.costs.source,
        "by_k": {
            str(d): {
                "mean_acceptance_length": round(v[0], 4),
                "speedup": round(v[1], 4),
                "basis": v[2],
            }
            for d, v in predicted.items()
        },
        "best_k": best,
        **_measured_beside(inputs, predicted),
    }
    if served is None or best == k or predicted[best][1] < served[1] * (1 + K_GAIN):
        return [], prediction
    if predicted[best][1] < 1:
        return [], prediction  # nothing pays: `weak` says so
    if best > k:
        # High acceptance that a deeper k would use better is not a cause of low acceptance.
        prediction["deeper"] = (
            f"k={best} predicts {predicted[best][1]:.2f}x against {served[1]:.2f}x at k={k} "
            f"(c={c}); drafters.{inputs.drafter}.num_speculative_tokens: {best} would use it"
        )
        return [], prediction
    marginal = [f"position {i + 1}: {rates[i]:.2f}" for i in range(min(k, len(rates)))]
    return [
        Finding(
            "k",
            f"k={k} is deeper than pays on {inputs.cluster}",
            f"predicted {served[1]:.2f}x at k={k} vs {predicted[best][1]:.2f}x at k={best} "
            f"(c={c}; per-position acceptance {', '.join(marginal)}; each draft token costs "
            f"{inputs.costs.source})",
            f"serve with k = {best}: drafters.{inputs.drafter}.num_speculative_tokens: {best}",
            predicted[best][1] - served[1],
        )
    ], prediction


def _measured_beside(
    inputs: DoctorInputs, predicted: dict[int, tuple[float, float, str]]
) -> dict[str, Any]:
    """What vLLM counted where the drafter serves, on the bench's prompts: beside the
    prediction, with its own basis, never mixed into it."""
    if inputs.measured is None:
        return {}
    measured = inputs.measured
    return {
        "measured_elsewhere": {
            "source": measured.source,
            "mean_acceptance_length": round(measured.mean_acceptance_length, 4),
            "per_position": [round(r, 4) for r in measured.per_position],
            "per_position_basis": BASIS_BENCH,
            "note": "counted by vLLM on the bench's prompts, not on the prompts replayed",
        }
    }


def _weak(
    inputs: DoctorInputs,
    scenarios: dict[str, Any],
    prediction: dict[str, Any],
    found: list[Finding],
) -> list[Finding]:
    """Nothing pays at any k on conversations like its training data (answered by the served
    target, else its held-out figures), and no mismatch explains it: the drafter itself is weak.
    Without either, the per-position acceptance the k prediction used stands in, and without that
    what vLLM counted where it serves: a drafter that carries neither a replay sample nor held-out
    figures (trained elsewhere, or with no held-out split) is judged by the engine's own count,
    never called healthy for want of evidence. (The k prediction keeps vLLM's rates beside it,
    not in its place; this verdict asks only whether the drafter pays at all.)"""
    if any(f.cause in MISMATCHES for f in found):
        return []
    rates, basis = per_position(scenarios.get("served_answers")), "its own prompts, replayed"
    if not rates and inputs.held_out_per_position:
        rates, basis = inputs.held_out_per_position, "its held-out figures"
    if not rates:
        rates, basis = list(prediction.get("per_position") or []), str(prediction.get("source"))
    if not rates and inputs.measured is not None and inputs.measured.per_position:
        rates, basis = list(inputs.measured.per_position), f"vLLM's count, {inputs.measured.source}"
    if not rates:
        return []
    c = inputs.concurrency
    speedups = {
        d: tokens_per_step(rates[:d]) / inputs.costs.cost(d, c) for d in range(1, len(rates) + 1)
    }
    best = max(speedups, key=lambda d: speedups[d])
    if speedups[best] >= 1:
        return []
    length = tokens_per_step(rates[: inputs.k])
    even = inputs.costs.cost(inputs.k, c)
    return [
        Finding(
            "weak",
            "the drafter does not pay at any k, even on conversations like its training data",
            f"mean acceptance length {length:.2f} at k={inputs.k} ({basis}); break-even there is "
            f"{even:.2f}; best predicted {speedups[best]:.2f}x at k={best}",
            "train longer or on more data (the held-out figures per checkpoint show whether it was "
            "still improving), or serve without speculation",
            even - length,
        )
    ]


def _notes(
    inputs: DoctorInputs, replay: dict[str, Any], figures: dict[str, float | None]
) -> list[str]:
    notes = []
    if not (replay.get("scenarios") or {}).get("served_features"):
        notes.append(
            "the drafter carries no replay sample (trained before kimideploy wrote one, or "
            "elsewhere): template and target drift were not measured"
        )
    agreement = replay.get("head_agreement")
    if agreement is not None and agreement < 0.98:
        notes.append(
            f"the target head chose the engine's generated token at only {agreement:.1%} of "
            "positions: the captured states may not be the served target's"
        )
    if inputs.measured is not None:
        held = (inputs.held_out or {}).get(inputs.k)
        if held is not None:
            notes.append(
                f"measured where it serves {inputs.measured.mean_acceptance_length:.2f} vs "
                f"{held:.2f} held-out as trained ({inputs.measured.source})"
            )
    return notes
