"""A start-up check, under a minute, that the GPUs can run this image's kernels.

Runs as the serve pod's init container (`python -m kimideploy.workloads.gpucheck`), before a
25-minute weight load. First what nvidia-smi says (how many GPUs, which architecture, which
driver) against what the image declares; then the device itself, because a declaration is not a
kernel:
- `torch-arch`: torch's compiled machine code runs on each visible device's architecture;
- `triton`: one Triton kernel compiles (launcher against Python.h with the image's C compiler,
  PTX with ptxas for this device) and adds two vectors correctly;
- `marlin-moe`: one call of vLLM's Marlin MoE kernel, the kernel that serves Kimi-K2.5's INT4
  (W4A16, group 32) routed experts on every cluster in vLLM 0.32, at the expert shapes one of 8
  tensor-parallel ranks holds (hidden 7168, intermediate 2048 / 8), top-8, against the same
  experts dequantized and computed in plain torch;
- `moe`: one call of vLLM's fused-MoE Triton kernel (bf16) against plain torch, where the experts
  run on another kernel (a check that vLLM's own kernels launch at all);
- `allreduce`: an NCCL all-reduce across the pod's GPUs completes within the timeout (a blocked
  peer-to-peer path hangs here, not in the first forward pass) and reports its bus bandwidth;
- `flex-attention` (the train image): one compiled FlexAttention forward and backward at the
  drafter's attention shape (causal, bf16), against plain attention: the kernel training runs
  (speculators' `simple_flex_attention`), whose backward at head dim 128 can run out of shared
  memory on a GPU with 101,376 bytes per block (RTX PRO 6000, pytorch/pytorch#133254): that shows
  here in the first minute, not after the sidecar's load.
Each failure names what broke; exit 1 when anything did.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from kimideploy.config.images import MIN_DRIVER_FOR_CUDA
from kimideploy.formats.gpuinfo import (
    QUERY_FIELDS,
    arch_of,
    parse_query,
    uncovered,
    version_tuple,
)
from kimideploy.workloads import allreduce_probe

PROBES = ("torch-arch", "triton", "marlin-moe", "moe", "allreduce", "flex-attention")
KIMI_EXPERTS = {"hidden": 7168, "inner": 2048 // 8, "top": 8, "group": 32}
"""Kimi-K2.5's routed experts as one of 8 tensor-parallel ranks holds them (the intermediate size
is split, every expert stays): the shapes Marlin's tiles and its group-32 scales must take."""
PROBE_EXPERTS = 16
"""Experts in the probe: Kimi has 384, but the kernel's tiles are per expert; 16 keep the
quantization under a second."""
FLEX_SHAPE = (1, 32, 2048, 128)
"""(batch, heads, tokens, head dim) of the probe: an EAGLE-3 layer for a 7168-wide target attends
with head dim 128; 2,048 tokens make the blocks the training kernel runs."""


def problems(rows: list[dict[str, str]], archs: list[str], cuda: str, expected: int) -> list[str]:
    """Everything wrong with these GPUs for this image; empty when ready."""
    found = []
    if len(rows) != expected:
        found.append(f"{len(rows)} GPUs visible, the pod asked for {expected}")
    for arch in sorted({arch_of(r["compute_cap"]) for r in rows} - set(archs)):
        names = sorted({r["name"] for r in rows if arch_of(r["compute_cap"]) == arch})
        found.append(
            f"{', '.join(names)} is {arch}; this image is built for {', '.join(archs)} "
            "(use the cluster's image, or rebuild with this architecture)"
        )
    needed = MIN_DRIVER_FOR_CUDA.get(cuda)
    for driver in sorted({r["driver_version"] for r in rows}):
        if needed and version_tuple(driver) < version_tuple(needed):
            found.append(f"driver {driver} is older than {needed}, the minimum for CUDA {cuda}")
    return found


def torch_arch() -> str:
    """torch's compiled architectures cover every visible device."""
    import torch

    compiled = torch.cuda.get_arch_list()
    devices = {
        arch_of("{}.{}".format(*torch.cuda.get_device_capability(i))): torch.cuda.get_device_name(i)
        for i in range(torch.cuda.device_count())
    }
    if not devices:
        raise RuntimeError("torch sees no CUDA device")
    missing = uncovered(sorted(devices), compiled)
    if missing:
        names = ", ".join(f"{devices[a]} ({a})" for a in missing)
        raise RuntimeError(
            f"torch {torch.__version__} has no kernels for {names}: compiled for "
            f"{' '.join(compiled)}"
        )
    return f"torch's kernels ({' '.join(compiled)}) run on {', '.join(sorted(devices))}"


def triton() -> str:
    """Compile and launch one Triton kernel; its sum must be exact."""
    import torch

    from kimideploy.workloads.triton_kernel import add_kernel

    n = 1 << 20
    x = torch.arange(n, device="cuda", dtype=torch.float32)
    y = torch.full_like(x, 2.0)
    out = torch.empty_like(x)
    started = time.monotonic()
    add_kernel[((n + 1023) // 1024,)](x, y, out, n, BLOCK=1024)
    torch.cuda.synchronize()
    if not torch.equal(out, x + 2.0):
        raise RuntimeError("the Triton kernel ran but computed the wrong sum")
    return f"a Triton kernel compiled and ran in {time.monotonic() - started:.1f} s"


def moe() -> str:
    """One fused-MoE call (vLLM's Triton kernel, bf16, top-2 of 8 experts) against plain torch."""
    import torch
    from vllm.model_executor.layers.fused_moe import fused_experts

    torch.manual_seed(0)
    tokens, hidden, inner, experts, top = 16, 256, 512, 8, 2
    dtype, device = torch.bfloat16, "cuda"
    x = torch.randn(tokens, hidden, dtype=dtype, device=device) / 4
    w1 = torch.randn(experts, 2 * inner, hidden, dtype=dtype, device=device) / 16
    w2 = torch.randn(experts, hidden, inner, dtype=dtype, device=device) / 16
    scores = torch.randn(tokens, experts, device=device).softmax(-1)
    weights, ids = scores.topk(top, dim=-1)
    fused = fused_experts(x, w1, w2, weights.float(), ids.to(torch.int32))
    reference = torch.zeros(tokens, hidden, dtype=torch.float32, device=device)
    for slot in range(top):
        for token in range(tokens):
            expert = int(ids[token, slot])
            gate, up = (w1[expert].float() @ x[token].float()).chunk(2)
            inner_out = torch.nn.functional.silu(gate) * up
            reference[token] += weights[token, slot] * (w2[expert].float() @ inner_out)
    error = (fused.float() - reference).abs().max().item()
    scale = reference.abs().max().item()
    if error > 0.05 * max(scale, 1e-3):
        raise RuntimeError(
            f"fused MoE differs from torch by {error:.3g} (outputs up to {scale:.3g})"
        )
    return f"vLLM's fused-MoE kernel agrees with torch (max error {error:.2g} of {scale:.2g})"


def marlin_inputs(
    device: str, experts: int = PROBE_EXPERTS, tokens: int = 16
) -> tuple[tuple[Any, ...], dict[str, Any], Any]:
    """(positional and keyword arguments of vLLM's fused_marlin_moe, the torch reference): random
    experts at KIMI_EXPERTS quantized to symmetric INT4 with group-32 scales (uint4b8, what
    compressed-tensors' W4A16 checkpoints hold) and packed as Marlin reads them, by vLLM's own
    helper; the reference computes the dequantized experts in float32."""
    import torch
    from vllm.model_executor.layers.quantization.utils.marlin_utils_test import marlin_quantize
    from vllm.scalar_type import scalar_types

    torch.manual_seed(0)
    hidden, inner, top, group = (KIMI_EXPERTS[k] for k in ("hidden", "inner", "top", "group"))
    quant = scalar_types.uint4b8
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device=device) / 4
    packed: list[tuple[Any, Any, Any]] = []
    for rows, cols in ((2 * inner, hidden), (hidden, inner)):  # w1: gate and up; w2: down
        weights = torch.randn(experts, rows, cols, dtype=torch.bfloat16, device=device) / 16
        # Marlin takes each expert as (k, n): the GEMM's input width first.
        parts = [marlin_quantize(w.transpose(0, 1).contiguous(), quant, group) for w in weights]
        packed.append(tuple(torch.stack([p[i] for p in parts]) for i in range(3)))
    (ref1, q1, s1), (ref2, q2, s2) = packed
    scores = torch.randn(tokens, experts, device=device).softmax(-1)
    topk_weights, topk_ids = scores.topk(top, dim=-1)
    reference = torch.zeros(tokens, hidden, dtype=torch.float32, device=device)
    for slot in range(top):
        chosen = topk_ids[:, slot]
        gate, up = torch.bmm(x.float().unsqueeze(1), ref1[chosen].float()).squeeze(1).chunk(2, -1)
        down = torch.bmm((torch.nn.functional.silu(gate) * up).unsqueeze(1), ref2[chosen].float())
        reference += topk_weights[:, slot : slot + 1] * down.squeeze(1)
    args = (x, q1, q2, None, None, s1, s2, topk_weights.float(), topk_ids.to(torch.int32))
    return args, {"quant_type_id": quant.id, "global_num_experts": experts}, reference


def marlin_moe() -> str:
    """One Marlin MoE call at Kimi-K2.5's INT4 expert shapes against the torch reference."""
    from vllm.model_executor.layers.fused_moe.experts.marlin_moe import fused_marlin_moe

    started = time.monotonic()
    args, keywords, reference = marlin_inputs("cuda")
    fused = fused_marlin_moe(*args, **keywords)
    error = (fused.float() - reference).abs().max().item()
    scale = reference.abs().max().item()
    if error > 0.05 * max(scale, 1e-3):
        raise RuntimeError(
            f"Marlin MoE differs from torch by {error:.3g} (outputs up to {scale:.3g}) at "
            f"hidden {KIMI_EXPERTS['hidden']}, intermediate {KIMI_EXPERTS['inner']}, group "
            f"{KIMI_EXPERTS['group']}"
        )
    return (
        f"vLLM's Marlin MoE kernel (INT4, group {KIMI_EXPERTS['group']}, hidden "
        f"{KIMI_EXPERTS['hidden']}, intermediate {KIMI_EXPERTS['inner']}, top-"
        f"{KIMI_EXPERTS['top']}) agrees with torch (max error {error:.2g} of {scale:.2g}) in "
        f"{time.monotonic() - started:.1f} s"
    )


def flex_attention(device: str = "cuda", shape: tuple[int, int, int, int] = FLEX_SHAPE) -> str:
    """FlexAttention compiled, forward and backward, causal, against scaled-dot-product attention
    (the same maths, another kernel): outputs and the query's gradient agree."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask
    from torch.nn.attention.flex_attention import flex_attention as flex

    torch.manual_seed(0)
    batch, heads, tokens, dim = shape
    dtype = torch.bfloat16 if device == "cuda" else torch.float32

    def causal(b: object, h: object, q: object, k: object) -> object:
        return q >= k  # type: ignore[operator]

    mask = create_block_mask(causal, None, None, tokens, tokens, device=device)
    compiled = torch.compile(flex)
    backward = device != "cpu"  # FlexAttention has no CPU backward; the GPU's is the point
    q, k, v = (
        torch.randn(batch, heads, tokens, dim, device=device, dtype=dtype, requires_grad=backward)
        for _ in range(3)
    )
    started = time.monotonic()
    out = compiled(q, k, v, block_mask=mask)
    if backward:
        out.float().square().sum().backward()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.monotonic() - started
    q2, k2, v2 = (t.detach().clone().requires_grad_(backward) for t in (q, k, v))
    reference = torch.nn.functional.scaled_dot_product_attention(q2, k2, v2, is_causal=True)
    error = (out.float() - reference.float()).abs().max().item()
    tolerance = 0.05 if dtype == torch.bfloat16 else 1e-3
    grad_error, grad_scale = 0.0, 1.0
    if backward:
        reference.float().square().sum().backward()
        assert q.grad is not None and q2.grad is not None
        grad_error = (q.grad.float() - q2.grad.float()).abs().max().item()
        grad_scale = q2.grad.float().abs().max().item()
    if error > tolerance or grad_error > tolerance * max(grad_scale, 1.0):
        raise RuntimeError(
            f"FlexAttention differs from SDPA: outputs by {error:.3g}, the query's gradient by "
            f"{grad_error:.3g} (of {grad_scale:.3g})"
        )
    passes = "forward and backward" if backward else "forward"
    return (
        f"FlexAttention {passes} at {heads} heads x {tokens} tokens x head dim {dim} "
        f"compiled and ran in {seconds:.1f} s, matching SDPA"
    )


class SlowAllReduceError(RuntimeError):
    """The all-reduce completed below the cluster's network.min_node_bus_gbps."""


def allreduce(gpus: int, timeout_s: float, min_bus_gbps: float | None = None) -> str:
    result = allreduce_probe.local(gpus, timeout_s=timeout_s)
    timing = f"{result.bytes >> 20} MiB in {result.seconds * 1e3:.1f} ms"
    if gpus == 1:
        return f"NCCL initialised and reduced on 1 GPU ({timing}; nothing crossed a link)"
    figure = (
        f"NCCL all-reduce over {gpus} GPUs: {result.bus_gbps:.1f} GB/s bus bandwidth ({timing})"
    )
    if min_bus_gbps is not None and result.bus_gbps < min_bus_gbps:
        raise SlowAllReduceError(
            f"{figure}, below network.min_node_bus_gbps {min_bus_gbps:g}: peer-to-peer between "
            "the GPUs is off or crosses the CPU (`kimideploy host check` shows the topology, "
            "IOMMU, ACS and BAR1)"
        )
    return figure


def run_probes(
    names: list[str], gpus: int, timeout_s: float, min_bus_gbps: float | None = None
) -> list[tuple[str, bool, str]]:
    """(probe, ok, message) for each probe; an exception is that probe's failure."""
    probes: dict[str, Callable[[], str]] = {
        "torch-arch": torch_arch,
        "triton": triton,
        "marlin-moe": marlin_moe,
        "moe": moe,
        "allreduce": lambda: allreduce(gpus, timeout_s, min_bus_gbps),
        "flex-attention": flex_attention,
    }
    results = []
    for name in names:
        try:
            results.append((name, True, probes[name]()))
        except Exception as exc:  # every failure is reported, the others still run
            results.append((name, False, f"{type(exc).__name__}: {exc}"))
    return results


def _smi_rows() -> list[dict[str, str]]:
    output = subprocess.run(
        ["nvidia-smi", f"--query-gpu={QUERY_FIELDS}", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return parse_query(output)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--archs", required=True, help="Comma-separated, e.g. sm_100,sm_103")
    parser.add_argument("--cuda", required=True, help="The image's CUDA version, e.g. 12.9")
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument(
        "--probes", default="", help=f"Comma-separated device probes: {', '.join(PROBES)}"
    )
    parser.add_argument("--timeout-s", type=float, default=60.0, help="For the all-reduce")
    parser.add_argument(
        "--min-bus-gbps", type=float, default=None, help="The all-reduce fails below this"
    )
    args = parser.parse_args(argv)
    names = [p for p in args.probes.split(",") if p]
    unknown = sorted(set(names) - set(PROBES))
    if unknown:
        parser.error(f"unknown probes {', '.join(unknown)} (known: {', '.join(PROBES)})")
    try:
        rows = _smi_rows()
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"gpu-check: nvidia-smi failed: {exc}", file=sys.stderr)
        return 1
    found = problems(rows, args.archs.split(","), args.cuda, args.gpus)
    for problem in found:
        print(f"gpu-check: {problem}", file=sys.stderr)
    if found:
        return 1  # the probes would fail for the same reason, only later
    print("gpu-check: GPUs, architecture and driver suit this image", file=sys.stderr)
    failed = False
    for name, ok, message in run_probes(names, args.gpus, args.timeout_s, args.min_bus_gbps):
        print(f"gpu-check: {'ok  ' if ok else 'FAIL'} {name}: {message}", file=sys.stderr)
        failed = failed or not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
