"""Grouped weight gradients added straight into megatron's fp32 ``main_grad`` (one Triton kernel).

Why: with megatron-core's DDP every parameter has an fp32 ``main_grad`` that collects the gradient
of all micro-batches. Without fusion each expert weight-gradient GEMM writes a bf16 ``[E, out, in]``
tensor and DDP's hook then reads it back and adds it into ``main_grad``: 12 bytes of memory traffic
per expert parameter and micro-batch, where reading and writing ``main_grad`` alone is 8. The kernel
below computes ``main_grad[e] += dy[rows of e].T @ x[rows of e]`` with the product kept in fp32
until it lands in ``main_grad`` (so it is also the more exact of the two), and the layer tells DDP
the gradient is already there (``grad_added_to_main_grad``), as megatron-core's own linear layers
do with gradient-accumulation fusion.

Rows past ``offsets[-1]`` are padding and belong to no expert. The kernel needs CUDA and Triton; the
same contract on other devices (and the reference in tests) is :func:`accumulate_reference`.
Setting ``TRITON_INTERPRET=1`` before Triton is imported runs the kernel on the CPU (slowly), which
is how the CPU tests check it.
"""

from __future__ import annotations

import functools
import os

import torch

# Tiles of main_grad per program and rows per step: the fastest of a sweep at the Qwen3-30B-A3B
# expert shapes (docs/benchmarks/implementation_costs.md).
_BLOCK_OUT = 128
_BLOCK_IN = 128
_BLOCK_ROWS = 32
_NUM_WARPS = 4
_NUM_STAGES = 4


@functools.cache
def triton_available() -> bool:
    """Triton importable (it ships with CUDA builds of torch, not with every CPU build)."""
    try:
        # Deferred: the probe of an optional package (CPU builds of torch have no triton).
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except ImportError:
        return False
    return True


def triton_interpreting() -> bool:
    """Whether Triton kernels run on the CPU through Triton's interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def can_fuse(main_grad: torch.Tensor) -> bool:
    """Whether :func:`accumulate_grouped_wgrad` runs the fused kernel for this ``main_grad``."""
    if main_grad.dtype != torch.float32 or not main_grad.is_contiguous() or not triton_available():
        return False
    return main_grad.is_cuda or triton_interpreting()


@functools.cache
def _kernel():
    """Build the Triton kernel on first use (Triton is imported lazily: CPU builds may lack it)."""
    # Deferred: triton is optional (CPU builds of torch have none).
    import triton
    import triton.language as tl

    @triton.jit
    def grouped_wgrad_accumulate_kernel(
        dy_ptr,
        x_ptr,
        offsets_ptr,
        main_grad_ptr,
        n_out,
        n_in,
        stride_dy,
        stride_x,
        BLOCK_OUT: tl.constexpr,
        BLOCK_IN: tl.constexpr,
        BLOCK_ROWS: tl.constexpr,
        EXACT_FP32: tl.constexpr,
    ):
        # Axis 0 walks the tiles of one expert so that neighbouring programs share its rows in L2.
        tile = tl.program_id(0)
        expert = tl.program_id(1)
        tiles_in = tl.cdiv(n_in, BLOCK_IN)
        out_idx = (tile // tiles_in) * BLOCK_OUT + tl.arange(0, BLOCK_OUT)
        in_idx = (tile % tiles_in) * BLOCK_IN + tl.arange(0, BLOCK_IN)
        row_start = tl.load(offsets_ptr + expert).to(tl.int64)
        row_end = tl.load(offsets_ptr + expert + 1).to(tl.int64)
        if row_end > row_start:
            acc = tl.zeros((BLOCK_OUT, BLOCK_IN), dtype=tl.float32)
            for first in range(row_start, row_end, BLOCK_ROWS):
                rows = first + tl.arange(0, BLOCK_ROWS).to(tl.int64)
                live = rows < row_end
                dy = tl.load(
                    dy_ptr + rows[:, None] * stride_dy + out_idx[None, :],
                    mask=live[:, None] & (out_idx[None, :] < n_out),
                    other=0.0,
                )
                x = tl.load(
                    x_ptr + rows[:, None] * stride_x + in_idx[None, :],
                    mask=live[:, None] & (in_idx[None, :] < n_in),
                    other=0.0,
                )
                if EXACT_FP32:  # fp32 inputs: no TF32 rounding (torch's matmuls do not use it by default)
                    acc = tl.dot(tl.trans(dy), x, acc, input_precision="ieee")
                else:
                    acc = tl.dot(tl.trans(dy), x, acc)
            target = (
                main_grad_ptr
                + expert.to(tl.int64) * n_out * n_in
                + out_idx[:, None].to(tl.int64) * n_in
                + in_idx[None, :]
            )
            inside = (out_idx[:, None] < n_out) & (in_idx[None, :] < n_in)
            tl.store(target, tl.load(target, mask=inside, other=0.0) + acc, mask=inside)

    return grouped_wgrad_accumulate_kernel


def expert_offsets(counts: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``[0, c0, c0+c1, ...]`` as int32 on ``device`` (the kernel's row ranges per expert)."""
    offsets = torch.zeros(counts.numel() + 1, dtype=torch.int32, device=device)
    torch.cumsum(counts.to(device=device), dim=0, out=offsets[1:])
    return offsets


def accumulate_grouped_wgrad(dy: torch.Tensor, x: torch.Tensor, counts: torch.Tensor, main_grad: torch.Tensor) -> None:
    """``main_grad[e] += dy[rows of e].T @ x[rows of e]`` in place, products summed in fp32.

    ``dy`` is ``[T, out]``, ``x`` ``[T, in]`` (rows sorted by expert, padding rows at the end),
    ``counts`` the rows per expert, ``main_grad`` ``[E, out, in]`` fp32 (see :func:`can_fuse`).
    """
    num_experts, n_out, n_in = main_grad.shape
    if counts.numel() != num_experts or dy.shape[1] != n_out or x.shape[1] != n_in:
        raise ValueError(
            f"shapes disagree: dy {tuple(dy.shape)}, x {tuple(x.shape)}, {counts.numel()} counts, "
            f"main_grad {tuple(main_grad.shape)}"
        )
    if not can_fuse(main_grad):
        raise RuntimeError("the fused wgrad accumulation needs a contiguous fp32 CUDA main_grad and Triton")
    if num_experts == 0 or dy.shape[0] == 0:
        return
    dy, x = dy.contiguous(), x.contiguous()
    offsets = expert_offsets(counts, dy.device)
    tiles = _cdiv(n_out, _BLOCK_OUT) * _cdiv(n_in, _BLOCK_IN)
    _kernel()[(tiles, num_experts)](
        dy,
        x,
        offsets,
        main_grad,
        n_out,
        n_in,
        dy.stride(0),
        x.stride(0),
        BLOCK_OUT=_BLOCK_OUT,
        BLOCK_IN=_BLOCK_IN,
        BLOCK_ROWS=_BLOCK_ROWS,
        EXACT_FP32=dy.dtype == torch.float32,
        num_warps=_NUM_WARPS,
        num_stages=_NUM_STAGES,
    )


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def accumulate_reference(dy: torch.Tensor, x: torch.Tensor, counts: torch.Tensor, main_grad: torch.Tensor) -> None:
    """The same contract with per-expert fp32 matmuls (any device): the yardstick for the kernel."""
    start = 0
    for e, n in enumerate(int(c) for c in counts.tolist()):
        if n:
            main_grad[e] += dy[start : start + n].float().t() @ x[start : start + n].float()
        start += n
