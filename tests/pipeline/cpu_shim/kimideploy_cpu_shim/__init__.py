"""Test-only vLLM plugin: two CUDA-only paths of vLLM 0.32, made runnable on CPU.

Why: vLLM's `ExampleHiddenStatesConnector._submit_async_write` copies each finished request's
hidden states device-to-host on a dedicated CUDA stream into pinned memory, records CUDA events
and writes the file on a thread. On a machine without an NVIDIA driver the first of those calls
kills the CPU engine ("Found no NVIDIA driver"). This replaces only that method, and only when
the platform is CPU: the same slots are read from the same KV-cache buffer with vLLM's own
`extract_from_kv_cache`, the same file is written with the same lock protocol (the `.lock` file
held exclusively until the write is done), synchronously. Everything else (the speculative method,
the scheduler side, the file names, the reply's `hidden_states_path`) is the stock code.

Synthetic rejection sampling (`rejection_sample_method: synthetic`, what `run calibrate` serves):
the CPU build's stand-ins for the two rejection-sampling Triton kernels assert that synthetic mode is
off ("Synthetic acceptance not supported with CPU sampling"). `_synthetic_greedy` and
`_synthetic_random` do in Python what the Triton kernels do in synthetic mode, position by position:
a draft token is accepted when its uniform draw is below the conditional rate of its position
(padded drafts, id -1, never), the first rejection emits the target's token (greedy: its argmax;
random: the recovered token) and stops, and a fully accepted draft gets the bonus token. Outside
synthetic mode the stock C++ stand-ins run unchanged.

Draft forwards counted (only when KIMIDEPLOY_TEST_DRAFT_FORWARDS=1): every forward of an EAGLE-3
draft model adds one to $HOME/.kimideploy-draft-forwards, so a test can show that a server with
speculation switched off (patch 0002) runs no draft pass at all, which stock vLLM 0.32 still does
at k = 0.

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


def _synthetic_positions(output: Any, cu_num_draft: Any, draft: Any, uniform: Any, rates: Any,
                         rejected_token: Any, bonus: Any, rows: list[int]) -> None:  # fmt: skip
    width = output.shape[1]
    starts = [0, *cu_num_draft.tolist()[:-1]]
    ends = cu_num_draft.tolist()
    for row in rows:
        start, count = starts[row], ends[row] - starts[row]
        for pos in range(count):
            token = int(draft[start + pos])
            if token >= 0 and float(uniform[start + pos]) < float(rates[pos]):
                output[row, pos] = token
                continue
            output[row, pos] = int(rejected_token[start + pos])
            break
        else:
            if count < width:
                output[row, count] = int(bonus[row])


def _synthetic_greedy(stock: Any) -> Any:
    def kernel(output_token_ids: Any, cu_num_draft_tokens: Any, draft_token_ids: Any,
               target_argmax: Any, bonus_token_ids: Any, is_greedy: Any, max_spec_len: Any,
               uniform_probs: Any = None, synthetic_conditional_rates: Any = None,
               SYNTHETIC_MODE: bool = False) -> None:  # noqa: N803  # fmt: skip
        if not SYNTHETIC_MODE:
            stock(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax,
                  bonus_token_ids, is_greedy, max_spec_len)  # fmt: skip
            return
        rows = [
            r for r in range(output_token_ids.shape[0]) if is_greedy is None or bool(is_greedy[r])
        ]
        _synthetic_positions(output_token_ids, cu_num_draft_tokens, draft_token_ids,
                             uniform_probs, synthetic_conditional_rates, target_argmax,
                             bonus_token_ids, rows)  # fmt: skip

    return kernel


def _synthetic_random(stock: Any) -> Any:
    def kernel(output_token_ids: Any, cu_num_draft_tokens: Any, draft_token_ids: Any,
               draft_probs: Any, target_probs: Any, bonus_token_ids: Any,
               recovered_token_ids: Any, uniform_probs: Any, is_greedy: Any, max_spec_len: Any,
               vocab_size: Any, synthetic_conditional_rates: Any = None,
               NO_DRAFT_PROBS: bool = False, SYNTHETIC_MODE: bool = False) -> None:  # noqa: N803  # fmt: skip
        if not SYNTHETIC_MODE:
            stock(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs,
                  target_probs, bonus_token_ids, recovered_token_ids, uniform_probs, is_greedy,
                  max_spec_len, vocab_size, synthetic_conditional_rates, NO_DRAFT_PROBS)  # fmt: skip
            return
        rows = [r for r in range(output_token_ids.shape[0]) if not bool(is_greedy[r])]
        _synthetic_positions(output_token_ids, cu_num_draft_tokens, draft_token_ids,
                             uniform_probs, synthetic_conditional_rates, recovered_token_ids,
                             bonus_token_ids, rows)  # fmt: skip

    return kernel


DRAFT_FORWARDS_ENV = "KIMIDEPLOY_TEST_DRAFT_FORWARDS"
DRAFT_FORWARDS_FILE = ".kimideploy-draft-forwards"


def _count_draft_forwards() -> None:
    """Wrap the EAGLE-3 draft models' forward to count calls into $HOME (the pod's writable
    home: the server runs with a read-only root)."""
    from vllm.model_executor.models import deepseek_eagle3, llama_eagle3

    path = Path(os.environ.get("HOME") or "/tmp") / DRAFT_FORWARDS_FILE
    calls = [0]

    def counted(original: Any) -> Any:
        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            path.write_text(str(calls[0]))
            return original(self, *args, **kwargs)

        return forward

    for model in (llama_eagle3.Eagle3LlamaForCausalLM, deepseek_eagle3.Eagle3DeepseekV2ForCausalLM):
        model.forward = counted(model.forward)  # type: ignore[method-assign]


def register() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    if os.environ.get(DRAFT_FORWARDS_ENV) == "1":
        _count_draft_forwards()
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        ExampleHiddenStatesConnector,
    )

    ExampleHiddenStatesConnector._submit_async_write = _submit_sync_write  # type: ignore[method-assign]

    # Before the CPU platform registers its kernel stand-ins (vLLM loads plugins first and the
    # platform reads these module attributes when it registers).
    from vllm.utils import cpu_triton_utils

    cpu_triton_utils._rejection_greedy_sample_kernel_impl = _synthetic_greedy(
        cpu_triton_utils._rejection_greedy_sample_kernel_impl
    )
    cpu_triton_utils._rejection_random_sample_kernel_impl = _synthetic_random(
        cpu_triton_utils._rejection_random_sample_kernel_impl
    )
