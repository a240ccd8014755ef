"""Child program: the fused expert wgrad accumulation kernel run by Triton's CPU interpreter.

The parent sets ``TRITON_INTERPRET=1`` (it must be set before Triton is imported). Prints one
``REPORT {json}`` line: the kernel against per-expert fp32 matmuls (empty experts, padding rows,
shapes that are not multiples of the tile), and ``grouped_linear``'s backward with a DDP-style
``main_grad``: fused, unfused and deferred (``delay_wgrad_compute``). bf16 is not in the table:
the interpreter computes through NumPy, which has no bf16 (the GPU self-check covers it).
"""

import json

import torch

from megatron.bridge.models.torch_native.grouped_gemm import WgradStash, grouped_linear, grouped_wgrad
from megatron.bridge.models.torch_native.wgrad_accumulate import (
    accumulate_grouped_wgrad,
    accumulate_reference,
    can_fuse,
)

KERNEL_CASES = {  # name -> (rows per expert, padding rows, out, in, dtype)
    "uneven_with_empty_expert_and_padding": ([70, 0, 3, 130], 5, 200, 136, torch.float16),
    "fp32_single_row_experts": ([1, 1, 0, 2], 0, 64, 40, torch.float32),
    "all_experts_empty": ([0, 0, 0], 7, 32, 32, torch.float16),
}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-12))


def kernel_case(counts, padding, n_out, n_in, dtype) -> float:
    g = torch.Generator().manual_seed(len(counts) + n_out)
    counts = torch.tensor(counts)
    rows = int(counts.sum()) + padding
    dy = torch.randn(rows, n_out, generator=g).to(dtype)
    x = torch.randn(rows, n_in, generator=g).to(dtype)
    start = torch.randn(len(counts), n_out, n_in, generator=g)
    got, want = start.clone(), start.clone()
    accumulate_grouped_wgrad(dy, x, counts, got)
    accumulate_reference(dy, x, counts, want)
    return relative_error(got, want)


def backward_case(accumulation: str, deferred: bool) -> dict:
    """Two micro-batches through grouped_linear; what reached main_grad and weight.grad."""
    g = torch.Generator().manual_seed(3)
    counts = torch.tensor([5, 0, 9])
    weight = torch.nn.Parameter(torch.randn(3, 24, 16, generator=g))
    weight.main_grad = torch.zeros(3, 24, 16)
    weight.grad_added_to_main_grad = False
    stash = WgradStash()
    stash.enabled = deferred
    want = torch.zeros_like(weight.main_grad)
    for _ in range(2):
        x = torch.randn(16, 16, generator=g)
        dy = torch.randn(16, 24, generator=g)
        grouped_linear(x, weight, counts, "loop", stash, accumulation).backward(dy)
        if deferred:
            stash.compute(weight)
        want += grouped_wgrad(dy, x, counts, "loop", torch.float32)
        if not weight.grad_added_to_main_grad:  # what DDP's hook does with an unfused gradient
            weight.main_grad += weight.grad
        weight.grad = None
    return {"flag": bool(weight.grad_added_to_main_grad), "error": relative_error(weight.main_grad, want)}


report = {
    "can_fuse_cpu_fp32": can_fuse(torch.zeros(2, 2)),
    "can_fuse_cpu_bf16": can_fuse(torch.zeros(2, 2, dtype=torch.bfloat16)),
    "kernel": {name: kernel_case(*case) for name, case in KERNEL_CASES.items()},
    "backward": {
        f"{accumulation}{'_deferred' if deferred else ''}": backward_case(accumulation, deferred)
        for accumulation in ("fused", "unfused")
        for deferred in (False, True)
    },
}
print("REPORT " + json.dumps(report))
