"""Test-only vLLM plugin: the hidden-states connector's write, made runnable on CPU.

Why: vLLM's `ExampleHiddenStatesConnector._submit_async_write` copies each finished request's
hidden states device-to-host on a dedicated CUDA stream into pinned memory, records CUDA events
and writes the file on a thread. On a machine without an NVIDIA driver the first of those calls
kills the CPU engine ("Found no NVIDIA driver"). This replaces only that method, and only when
the platform is CPU: the same slots are read from the same KV-cache buffer with vLLM's own
`extract_from_kv_cache`, the same file is written with the same lock protocol (the `.lock` file
held exclusively until the write is done), synchronously. Everything else (the speculative method,
the scheduler side, the file names, the reply's `hidden_states_path`) is the stock code.

Loaded through vLLM's `vllm.general_plugins` entry point, found on PYTHONPATH next to this
package (tests/pipeline/pods.py puts it there); the GPU image never has it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


class _Done:
    """Stands in for the CUDA event vLLM polls: a synchronous write is complete at once."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


def _submit_sync_write(self: Any, pending: Any) -> None:
    import fcntl

    import torch
    from safetensors.torch import save_file
    from vllm.distributed.kv_transfer.kv_connector.v1 import example_hidden_states_connector as c

    if not self._is_tp_rank_zero:
        return
    block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
    offsets = torch.arange(0, self._block_size, dtype=torch.long)
    slots = (offsets.reshape(1, -1) + block_ids.reshape(-1, 1) * self._block_size).flatten()
    states = c.extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
    Path(pending.filename).parent.mkdir(parents=True, exist_ok=True)
    lock_fd = self._lock_fds.pop(pending.req_id, None)
    if lock_fd is None and self.use_lock:
        lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
    try:
        save_file({"hidden_states": states, "token_ids": pending.token_ids.clone()},
                  pending.filename)  # fmt: skip
    finally:
        if lock_fd is not None:
            os.close(lock_fd)
    self._req_copy_events[pending.req_id] = _Done()


def register() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        ExampleHiddenStatesConnector,
    )

    ExampleHiddenStatesConnector._submit_async_write = _submit_sync_write  # type: ignore[method-assign]
