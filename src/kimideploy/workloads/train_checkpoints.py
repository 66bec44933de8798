"""Training checkpoints on the volume: `step-N/` with the weights, the optimizer's and the
scheduler's state and `state.json` written last, renamed in whole; the last few kept, and the best
one by held-out acceptance kept whatever its age (it is the drafter the run hands over)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from kimideploy.workloads.runtime import atomic_write

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
