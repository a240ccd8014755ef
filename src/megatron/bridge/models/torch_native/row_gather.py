"""A row gather that stops at a row count held on the device (one Triton kernel).

Why: the EP sorted dispatcher's exchange buffers have a static, worst-case number of rows (``EP x
tokens x min(top-k, local experts)``) so that the host never needs the token counts; only the
first ``count`` rows hold real tokens, about ``1/EP`` of them on average at top-8 with many experts.
``index_select`` copies every row, padding included, so the copies into and out of those buffers
would grow with the EP size instead of with the tokens. Here the grid still covers every row (its
size is static, so it can be captured in a CUDA graph), but a program past ``count`` returns at
once: the copy costs what the real rows cost.

Rows of ``out`` from ``count`` on are left as they are. On other devices, and without Triton, the
same call is an ``index_select`` over all rows, which agrees on the first ``count`` rows. Setting
``TRITON_INTERPRET=1`` before Triton is imported runs the kernel on the CPU (how the CPU tests
check it).
"""

from __future__ import annotations

import functools
import os
from typing import Optional

import torch

from megatron.bridge.models.torch_native.wgrad_accumulate import triton_available

_ELEMENTS_PER_PROGRAM = 2048  # per loop step of one program; rows per program = this / row block
_MAX_COLUMN_BLOCK = 1024


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def uses_kernel(src: torch.Tensor) -> bool:
    """Whether :func:`gather_rows` runs the Triton kernel for ``src`` (else ``index_select``)."""
    return triton_available() and (src.is_cuda or _interpreting())


@functools.cache
def _kernel():
    """Build the Triton kernel on first use (CPU builds of torch may lack Triton)."""
    import triton
    import triton.language as tl

    @triton.jit
    def gather_rows_kernel(
        src_ptr, index_ptr, count_ptr, out_ptr, num_rows, width, src_row_stride, out_row_stride,
        BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
    ):
        first = tl.program_id(0) * BLOCK_ROWS
        count = tl.minimum(tl.load(count_ptr), num_rows)
        if first < count:
            rows = first + tl.arange(0, BLOCK_ROWS)
            live = rows < count
            source = tl.load(index_ptr + rows, mask=live, other=0).to(tl.int64)
            src_rows = src_ptr + source[:, None] * src_row_stride
            out_rows = out_ptr + rows.to(tl.int64)[:, None] * out_row_stride
            for start in range(0, width, BLOCK_COLS):
                cols = start + tl.arange(0, BLOCK_COLS)
                mask = live[:, None] & (cols < width)[None, :]
                tl.store(out_rows + cols[None, :], tl.load(src_rows + cols[None, :], mask=mask), mask=mask)

    return gather_rows_kernel


def gather_rows(
    src: torch.Tensor, index: torch.Tensor, count: torch.Tensor, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``out[i] = src[index[i]]`` for ``i < count``; rows from ``count`` on are not written.

    ``src`` and ``out`` are 2-D with contiguous rows (any row stride, e.g. a column of packed rows);
    ``index`` holds ``out``'s row count of indices; ``count`` is a one-element integer tensor on the
    device (never read on the host).
    """
    if out is None:
        out = torch.empty(index.numel(), src.shape[1], dtype=src.dtype, device=src.device)
    if src.dim() != 2 or out.shape != (index.numel(), src.shape[1]) or out.dtype != src.dtype:
        raise ValueError(f"gather_rows: src {tuple(src.shape)} {src.dtype} -> out {tuple(out.shape)} {out.dtype} "
                         f"with {index.numel()} indices")
    if not uses_kernel(src):
        return torch.index_select(src, 0, index, out=out)
    if src.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError("gather_rows: rows must be contiguous (stride 1 along the last dimension)")
    width = src.shape[1]
    block_cols = min(_MAX_COLUMN_BLOCK, max(16, 1 << (width - 1).bit_length()))
    block_rows = max(1, _ELEMENTS_PER_PROGRAM // block_cols)
    grid = (max(1, -(-index.numel() // block_rows)),)
    _kernel()[grid](
        src, index, count, out, index.numel(), width, src.stride(0), out.stride(0),
        BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, num_warps=4,
    )
    return out
