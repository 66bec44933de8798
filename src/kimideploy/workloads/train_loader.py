"""The training batches, packed ahead of the step.

Stored hidden states are read and packed by DataLoader worker processes (into pinned memory on a
GPU) while the current step runs, so a step never waits on the network filesystem; online
features come from the target server beside the trainer, requested a batch ahead (its own
prefetch). Either way the batches come in the order given: resume and the data order do not
depend on how they were read.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from kimideploy.workloads import heldout
from kimideploy.workloads.train_features import Features, StoredFeatures

PREFETCH_BATCHES = 2
"""Batches each worker packs ahead: enough to hide a read, little host memory (a batch of eight
8K-token Kimi samples is ~1 GB of bf16 features)."""


class PackedStoredBatches:
    """A map-style dataset (what DataLoader needs: len and indexing) of packed batches; the
    worker processes inherit it and load each batch's files themselves."""

    def __init__(
        self,
        features: StoredFeatures,
        batches: list[list[int]],
        *,
        max_seq_len: int,
        dtype: Any,
        multiple: int,
    ) -> None:
        self.files = [str(f) for f in features.dataset.files]
        self.batches, self.max_seq_len, self.dtype = batches, max_seq_len, dtype
        self.multiple = multiple

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> dict[str, Any]:
        from safetensors.torch import load_file

        saved = [load_file(self.files[i]) for i in self.batches[index]]
        return heldout.pack(saved, self.max_seq_len, "cpu", self.dtype, multiple=self.multiple)


def packed_batches(
    features: Features,
    batches: list[list[int]],
    *,
    max_seq_len: int,
    dtype: Any,
    device: Any,
    workers: int,
) -> Generator[dict[str, Any], None, None]:
    """Each batch of `batches` packed, on `device`, in order."""
    if workers > 0 and isinstance(features, StoredFeatures):
        from torch.utils.data import DataLoader

        cuda = device.type == "cuda"
        loader = DataLoader(
            PackedStoredBatches(
                features,
                batches,
                max_seq_len=max_seq_len,
                dtype=dtype,
                multiple=heldout.pack_multiple(device),
            ),
            batch_size=None,
            shuffle=False,
            num_workers=workers,
            pin_memory=cuda,
            prefetch_factor=PREFETCH_BATCHES,
        )
        for packed in loader:
            yield {k: v.to(device, non_blocking=cuda) for k, v in packed.items()}
        return
    for number, ids in enumerate(batches):
        # Online, the next batch is prefilled on the target server while this one trains.
        upcoming = batches[number + 1] if number + 1 < len(batches) else []
        features.prefetch(ids + upcoming)
        saved = [features.load(i) for i in ids]
        yield heldout.pack(
            saved, max_seq_len, device, dtype, multiple=heldout.pack_multiple(device)
        )
