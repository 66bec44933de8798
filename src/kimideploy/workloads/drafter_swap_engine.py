"""kimideploy's vLLM weight-transfer backend: a drafter's files, read from the models volume.

vLLM imports this module only through the factory entry `drafter_swap.register` makes, inside the
worker that holds the draft model; it subclasses vLLM's engine base class, so vLLM is imported at
the top (as workloads/triton_kernel.py imports Triton).

What one update does, in this order, so that a refused or failed swap leaves the running drafter
serving untouched:
1. the candidate folder is read once into memory (formats/drafter_swap.hold_drafter: regular
   files through the folder's descriptor, no link, FIFO or device, bounded sizes); a FIFO or a
   link to /dev/zero is refused at once instead of blocking or filling the worker between two
   scheduler steps. Where the keeper passes the sha256s the release recorded, the held bytes must
   match them;
2. the held files are judged against the drafter vLLM loaded at start-up by formats/drafter_swap's
   rule (config.json and tensor inventory), before any weight is written;
3. a tensor whose parameter vLLM shares with the target (at start-up vLLM shares the target's
   embedding and LM head with a drafter that has none or an identical copy) is named from the
   model's parameters, and the candidate is refused where its values for that name differ from
   the running drafter's: writing them would change the target, skipping them would serve what
   the candidate does not hold. Equal values are skipped, exactly as a fresh load shares them;
4. every other tensor, parsed from the held bytes, is written by the draft model's own
   `load_weights` (the same name mapping and tensor-parallel sharding as at start-up) inside
   vLLM's layerwise reload (`_load`);
5. if a write raises, the running drafter's files are loaded again the same way (a copy of the
   parameters would not do: the CPU build keeps linear weights packed outside them), and the
   error is raised to the caller.
Only draft updates are accepted: this backend never writes the target's weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from kimideploy.formats.drafter_swap import (
    SWAP_REFUSED,
    HeldDrafter,
    hold_drafter,
    sha256_mismatches,
    shared_refusals,
    swap_refusals,
)


@dataclass
class FilesInitInfo(WeightTransferInitInfo):  # type: ignore[misc]  # vLLM is untyped here
    """Nothing to set up: every replica already mounts the models volume."""


@dataclass
class FilesUpdateInfo(WeightTransferUpdateInfo):  # type: ignore[misc]
    """One update: the drafter folder, as the serving container mounts it, and the sha256 of each
    file the release recorded for it (empty: none recorded)."""

    path: str = ""
    sha256: dict[str, str] = field(default_factory=dict)


def _parameter_ids(module: torch.nn.Module) -> set[int]:
    """The module's parameters by identity: vLLM shares a module by assigning the target's own
    to the drafter. Not by storage pointer: the CPU build packs linear weights elsewhere and leaves
    empty parameters behind, whose pointers are all 0."""
    return {id(param) for param in module.parameters()}


class DrafterFilesEngine(WeightTransferEngine[FilesInitInfo, FilesUpdateInfo]):  # type: ignore[misc]
    init_info_cls = FilesInitInfo
    update_info_cls = FilesUpdateInfo
    supports_draft_weight_update = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        speculative = self.vllm_config.speculative_config
        draft_config = getattr(speculative, "draft_model_config", None)
        self.started_with = Path(draft_config.model) if draft_config is not None else None
        self.current = self.started_with
        self.skipped_shared: list[str] = []

    def init_transfer_engine(self, init_info: FilesInitInfo) -> None:
        return None

    def start_weight_update(self) -> None:
        if self.model is self._default_model:
            raise RuntimeError(
                "the kimideploy-drafter-files backend replaces the drafter only; "
                "start the update with /start_draft_weight_update"
            )

    def finish_weight_update(self) -> None:
        return None

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class synchronizes an accelerator, which a CPU engine does not have.
        self.receive_weights(self.parse_update_info(update_info))
        if torch.accelerator.is_available():
            torch.accelerator.synchronize()

    def _tensors(self, held: HeldDrafter, shared: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
        """The held files' tensors, one file at a time, without the shared ones."""
        from safetensors.torch import load

        for name in sorted(held.headers):
            for tensor_name, tensor in load(held.files[name]).items():
                if tensor_name not in shared:
                    yield tensor_name, tensor

    def _shared_with_target(self, held: HeldDrafter) -> set[str]:
        """Checkpoint names whose parameter in the draft model is the target's own, by name."""
        target = _parameter_ids(self._default_model)
        params = dict(self.model.named_parameters(remove_duplicate=False))
        shared = set()
        for name in held.tensors():
            for candidate in (name, f"model.{name}"):
                param = params.get(candidate)
                if param is not None and id(param) in target:
                    shared.add(name)
        return shared

    def receive_weights(self, update_info: FilesUpdateInfo) -> None:
        folder, running_folder = Path(update_info.path), self.current
        if self.started_with is None or running_folder is None:
            raise RuntimeError("this server was started without a drafter folder to compare with")
        candidate = hold_drafter(folder)
        started = hold_drafter(self.started_with)
        refusals = swap_refusals(started, candidate)
        if not refusals and update_info.sha256:
            refusals = sha256_mismatches(candidate, update_info.sha256)
        shared = self._shared_with_target(candidate) if not refusals else set()
        running = started if running_folder == self.started_with else hold_drafter(running_folder)
        if not refusals:
            refusals = running.problems or shared_refusals(running, candidate, shared)
        if refusals:
            raise ValueError(
                f"{folder} {SWAP_REFUSED} ({self.started_with}) without a restart: "
                + "; ".join(refusals)
            )
        try:
            with torch.no_grad():
                self._load(candidate, shared)
        except BaseException as failed:
            # The running drafter's files, loaded the same way, put back what was written.
            try:
                with torch.no_grad():
                    self._load(running, self._shared_with_target(running))
            except BaseException as restoring:
                raise RuntimeError(
                    f"loading {folder} failed ({failed}) and reloading the running drafter "
                    f"{running_folder} failed too ({restoring}): restart the server"
                ) from failed
            raise
        self.current = folder
        self.skipped_shared = sorted(shared)

    def _load(self, held: HeldDrafter, shared: set[str]) -> None:
        """vLLM's layerwise reload around the draft model's own `load_weights`: each layer gets
        its loading-time parameters back, is processed again once loaded (the CPU build repacks
        linear weights; quantized layers are re-quantized) and copied into the storage the engine
        already uses (CUDA graphs keep their pointers). A layer that receives nothing (a shared
        one) gets its own tensors back untouched."""
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        initialize_layerwise_reload(self.model)
        try:
            self.model.load_weights(self._tensors(held, shared))
        finally:
            finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        return None
