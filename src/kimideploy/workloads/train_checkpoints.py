"""Training checkpoints on the volume: `step-N/` with the weights, the optimizer's and the
scheduler's state and `state.json` written last, renamed in whole; the last few kept, and the best
one by held-out acceptance kept whatever its age (it is the drafter the run hands over)."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kimideploy.config.specs import TrainSpec
from kimideploy.workloads.runtime import BadInputError, atomic_write

STATE_FILE = "state.json"
WEIGHTS_FILE = "model.safetensors"
KEEP_CHECKPOINTS = 3


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def complete(root: Path) -> list[Path]:
    """Every step-N directory whose state.json was written (the last thing written), in order."""
    return sorted(p for p in root.glob("step-*") if (p / STATE_FILE).is_file())


def latest(root: Path) -> Path | None:
    found = complete(root)
    return found[-1] if found else None


def write(
    root: Path,
    step: int,
    weights: dict[str, Any],
    optimizer: Any,
    scheduler: Any,
    record: dict[str, Any],
) -> Path:
    """step-N/ written beside the others and renamed in; state.json last."""
    import torch
    from safetensors.torch import save_file

    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    if (final / STATE_FILE).is_file():
        return final
    tmp = root / f".tmp-step-{step:08d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file(weights, str(tmp / WEIGHTS_FILE))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    atomic_write(tmp / STATE_FILE, json.dumps(record, indent=2).encode())
    if final.exists():  # an incomplete directory left by a crash mid-write
        shutil.rmtree(final)
    tmp.rename(final)
    return final


def prune(root: Path, keep: set[str]) -> None:
    """Keep the newest KEEP_CHECKPOINTS and every directory named in `keep` (the best)."""
    found = complete(root)
    for old in found[:-KEEP_CHECKPOINTS]:
        if old.name not in keep:
            shutil.rmtree(old, ignore_errors=True)


def state(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((path / STATE_FILE).read_text())
    return loaded


def restore(path: Path, model: Any, optimizer: Any, scheduler: Any, *, device: Any) -> None:
    """Weights, optimizer and scheduler exactly as they were at that step. A checkpoint written
    before schedules existed has no scheduler.pt: the scheduler then starts at the step count."""
    import torch
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(path / WEIGHTS_FILE)), strict=True)
    optimizer.load_state_dict(
        torch.load(path / "optimizer.pt", map_location=device, weights_only=True)
    )
    saved = path / "scheduler.pt"
    if saved.is_file():
        scheduler.load_state_dict(torch.load(saved, map_location=device, weights_only=True))


def load_weights(path: Path, model: Any) -> None:
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(path / WEIGHTS_FILE)), strict=True)


@dataclass
class Position:
    """Where training stands; a checkpoint stores it and a resumed run starts from it."""

    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0
    tokens: int = 0
    skipped_steps: int = 0
    """Steps whose loss or gradient norm was not finite on a rank (no optimizer step)."""

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Position:
        skipped = int(state.get("skipped_steps", 0))  # absent from checkpoints before it counted
        return cls(state["step"], state["epoch"], state["step_in_epoch"], state["tokens"], skipped)


@dataclass(frozen=True)
class Resumed:
    """What a restarted pod takes from the newest checkpoint (weights and optimizer restored)."""

    source: Path
    position: Position
    best: dict[str, Any] | None


def check_resumable(
    state: dict[str, Any],
    source: Path,
    *,
    dataset: str | None,
    split: dict[str, Any],
    fraction: float,
) -> None:
    """A checkpoint of another dataset, or one that held out other samples, cannot be resumed:
    its step and data order belong to the other run, or it would train on what it is judged on."""
    if state.get("dataset") and dataset and state["dataset"] != dataset:
        raise BadInputError(
            f"{source} was trained on dataset {state['dataset']}, this run trains on {dataset}: "
            "its step and data order belong to the other dataset",
            hint="start a new run (without train.resume_run), or train on that dataset",
        )
    recorded = (state.get("split") or {}).get("held_out_ids_sha256")
    if recorded and recorded != split["held_out_ids_sha256"]:
        raise BadInputError(
            f"{source} held out other samples ({state['split']['held_out_samples']} at "
            f"fraction {state['split']['fraction']}) than this run would "
            f"({split['held_out_samples']} at {fraction}): "
            "resuming would train on samples it was judged on",
            hint="keep train.held_out_fraction as it was, or start a new run",
        )


class Checkpoints:
    """The run's checkpoints: written by rank 0 (step-N/, state.json last), pruned to the newest
    few and the best, and read back on a restart (this run's folder, else train.resume_run's)."""

    def __init__(
        self, spec: TrainSpec, *, leader: bool, split: dict[str, Any], dataset: str | None
    ) -> None:
        self.root = Path(spec.checkpoint_dir)
        self.resume_root = Path(spec.resume_dir) if spec.resume_dir else None
        self.spec, self.leader, self.split, self.dataset = spec, leader, split, dataset

    def written(self, step: int) -> bool:
        return (step_dir(self.root, step) / STATE_FILE).is_file()

    def held_out_of(self, step: int) -> dict[str, Any] | None:
        """The held-out judgement stored with the checkpoint of `step`, if there is one."""
        if not self.written(step):
            return None
        judged: dict[str, Any] | None = state(step_dir(self.root, step)).get("held_out")
        return judged

    def save(
        self,
        model: Any,
        optimizer: Any,
        scheduler: Any,
        *,
        position: Position,
        record: dict[str, Any],
        best_step: int | None,
    ) -> Path | None:
        """Rank 0 writes the checkpoint of `position` with `record` merged into its state; the
        other ranks write nothing (and return None)."""
        if not self.leader:
            return None
        weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        full = {
            **asdict(position),
            "run_id": self.spec.run_id,
            **record,
            "split": self.split,
            "dataset": self.dataset,
        }
        final = write(self.root, position.step, weights, optimizer, scheduler, full)
        prune(self.root, {step_dir(self.root, best_step).name} if best_step is not None else set())
        return final

    def resume(self, model: Any, optimizer: Any, scheduler: Any, *, device: Any) -> Resumed | None:
        """Restore the newest checkpoint into the model, optimizer and scheduler; None when there
        is none to resume from."""
        found = latest(self.root)
        if found is None and self.resume_root is not None:
            found = latest(self.resume_root)
        if found is None:
            return None
        saved = state(found)
        check_resumable(
            saved,
            found,
            dataset=self.dataset,
            split=self.split,
            fraction=self.spec.held_out_fraction,
        )
        restore(found, model, optimizer, scheduler, device=device)
        position = Position.from_state(saved)
        if scheduler.last_epoch != position.step:  # written before schedules existed
            scheduler.last_epoch = position.step - 1
            scheduler.step()
        return Resumed(found, position, saved.get("best"))
