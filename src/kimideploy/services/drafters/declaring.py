"""`kimideploy drafter new NAME`: the registry entry a training run writes into, declared before
the run, so `run train --drafter NAME` and later `up serve --drafter NAME` know the name.

The entry is the cluster's training drafter's shape (its layers, k, draft vocabulary and decoder),
trained from scratch or fine-tuned from `base`, at `drafters/NAME` on the models volume, status
`planned`, with a lineage naming the target it will be trained on. The file is edited in place
(comments kept) and validated before it is written; nothing is written when the name exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimideploy.config import yaml_edit
from kimideploy.config.loading import LoadedProject, load_project_text
from kimideploy.errors import UsageError


@dataclass(frozen=True)
class NewDrafter:
    name: str
    cluster: str
    base: str | None = None
    """A drafter to fine-tune from (its shape is taken); None: the cluster's training drafter's
    shape, trained from scratch."""


def declare(loaded: LoadedProject, asked: NewDrafter) -> dict[str, Any]:
    """Write the entry into the project file; returns what was written."""
    project = loaded.project
    if asked.name in project.drafters or asked.name == "none":
        raise UsageError(
            f"drafter {asked.name} exists already in {loaded.path}",
            hint="pick another name, or train into it: `kimideploy run train --drafter "
            f"{asked.name}`",
        )
    shape_of = asked.base or project.clusters[asked.cluster].workloads.train.drafter
    shape = project.eagle_drafter(shape_of)
    # The revision it is trained on is the training run's to record (its lineage file): the
    # file's model.revision may still be a placeholder, or change before the run.
    lineage: dict[str, Any] = {"trained_for": project.model.repo}
    if asked.base is not None:
        lineage["base_drafter"] = asked.base
    values: dict[str, Any] = {
        "description": f"Trained by `kimideploy run train --drafter {asked.name}`.",
        "source": {"path": f"drafters/{asked.name}"},
        "decoder": shape.decoder,
        "num_speculative_tokens": shape.num_speculative_tokens,
        "aux_layer_ids": list(shape.aux_layer_ids),
        "layer_id_convention": shape.layer_id_convention,
        "draft_vocab_size": shape.draft_vocab_size,
        "status": "planned",
        "lineage": lineage,
    }
    config = Path(loaded.path)
    with yaml_edit.editing(config):
        text = config.read_text()
        edited = yaml_edit.add_entry(text, ("drafters",), asked.name, values)
        load_project_text(edited, config)  # never write a file that no longer validates
        yaml_edit.replace_text(config, edited)
    return values
