"""Row copies and gathers over strided rows that stop at a row count held on the device (one
Triton kernel).

Why: the EP sorted dispatcher's exchange buffers have a static, worst-case number of rows (``EP x
tokens x min(top-k, local experts)``) so that the host never needs the token counts; only the
first ``count`` rows hold real tokens, about ``1/EP`` of them on average at top-8 with many experts.
``index_select`` copies every row, padding included, so the copies into and out of those buffers
would grow with the EP size instead of with the tokens. Here the grid still covers every row (its
size is static, so it can be captured in a CUDA graph), but a program past ``count`` returns at
once: the copy costs what the real rows cost.

The same kernel does the plain copies of those packed columns (no index), so every copy into and
out of the buffers has one path; for the 8-byte-word columns torch's own copy is about as fast. One
launch copies up to two columns with the same rows (:func:`gather_row_pairs`: the dispatch's token
and probability columns), since on the host each launch costs more than the copy of a small column.
A second kernel does the unpermutation's gather-and-sum in one pass (:func:`gather_sum_rows`).

Rows of ``out`` from ``count`` on are left as they are. On other devices, and without Triton, the
same call is an ``index_select`` over all rows, which agrees on the first ``count`` rows. Setting
``TRITON_INTERPRET=1`` before Triton is imported runs the kernel on the CPU (how the CPU tests
check it).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from megatron.bridge.models.torch_native.wgrad_accumulate import triton_available, triton_interpreting

_ELEMENTS_PER_PROGRAM = 2048  # per loop step of one program; rows per program = this / row block
_MAX_COLUMN_BLOCK = 1024


def uses_kernel(src: torch.Tensor) -> bool:
    """Whether :func:`gather_rows` runs the Triton kernel for ``src`` (else ``index_select``)."""
    return triton_available() and (src.is_cuda or triton_interpreting())


@functools.cache
def _kernel():
    """Build the row-gather kernel on first use (CPU builds of torch may lack Triton)."""
    # Deferred: triton is optional (CPU builds of torch have none).
    import triton
    import triton.language as tl

    @triton.jit
    def gather_rows_kernel(
        src_ptr,
        out_ptr,
        width,
        src_row_stride,
        out_row_stride,
        src2_ptr,
        out2_ptr,
        width2,
        src2_row_stride,
        out2_row_stride,
        index_ptr,
        count_ptr,
        num_rows,
        HAS_INDEX: tl.constexpr,
        HAS_COUNT: tl.constexpr,
        HAS_SECOND: tl.constexpr,
        BLOCK_ROWS: tl.constexpr,
        BLOCK_COLS: tl.constexpr,
        BLOCK_COLS2: tl.constexpr,
    ):
        first = tl.program_id(0) * BLOCK_ROWS
        count = num_rows
        if HAS_COUNT:
            count = tl.minimum(tl.load(count_ptr), num_rows)
        if first < count:
            rows = first + tl.arange(0, BLOCK_ROWS)
            live = rows < count
            if HAS_INDEX:
                source = tl.load(index_ptr + rows, mask=live, other=0).to(tl.int64)
            else:
                source = rows.to(tl.int64)
            rows = rows.to(tl.int64)
            src_rows = src_ptr + source[:, None] * src_row_stride
            out_rows = out_ptr + rows[:, None] * out_row_stride
            for start in range(0, width, BLOCK_COLS):
                cols = start + tl.arange(0, BLOCK_COLS)
                mask = live[:, None] & (cols < width)[None, :]
                tl.store(out_rows + cols[None, :], tl.load(src_rows + cols[None, :], mask=mask), mask=mask)
            if HAS_SECOND:  # the same rows of a second (src, out) pair; nested jit helpers need module scope
                src_rows2 = src2_ptr + source[:, None] * src2_row_stride
                out_rows2 = out2_ptr + rows[:, None] * out2_row_stride
                for start2 in range(0, width2, BLOCK_COLS2):
                    cols2 = start2 + tl.arange(0, BLOCK_COLS2)
                    mask2 = live[:, None] & (cols2 < width2)[None, :]
                    tl.store(out_rows2 + cols2[None, :], tl.load(src_rows2 + cols2[None, :], mask=mask2), mask=mask2)

    return gather_rows_kernel


def _column_block(width: int) -> int:
    """Elements of a row one program handles per step: the row's width rounded up to a power of two,
    at least 16 and at most :data:`_MAX_COLUMN_BLOCK`."""
    return min(_MAX_COLUMN_BLOCK, max(16, 1 << (width - 1).bit_length()))


@functools.cache
def _sum_kernel():
    """Build the gather-sum kernel on first use."""
    # Deferred, as in _kernel().
    import triton
    import triton.language as tl

    @triton.jit
    def gather_sum_kernel(
        rows_ptr,
        pos_ptr,
        out_ptr,
        width,
        rows_stride,
        out_stride,
        K: tl.constexpr,
        BLOCK_COLS: tl.constexpr,
    ):
        token = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
        mask = cols < width
        acc = tl.zeros((BLOCK_COLS,), dtype=tl.float32)
        for j in tl.static_range(K):  # left to right, as torch's sum over the k dimension
            row = tl.load(pos_ptr + token * K + j).to(tl.int64)
            acc += tl.load(rows_ptr + row * rows_stride + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + token * out_stride + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)

    return gather_sum_kernel


def gather_rows(
    src: torch.Tensor,
    index: torch.Tensor | None = None,
    count: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out[i] = src[index[i]]`` (``src[i]`` without ``index``) for ``i < count`` (every row without
    ``count``); rows from ``count`` on are not written.

    ``src`` and ``out`` are 2-D with contiguous rows and any row stride (a column of packed rows).
    ``index`` holds one source row per output row; ``count`` is a one-element integer tensor on the
    device (never read on the host).
    """
    num_rows = src.shape[0] if index is None else index.numel()
    if out is None:
        out = torch.empty(num_rows, src.shape[1], dtype=src.dtype, device=src.device)
    gather_row_pairs([(src, out)], index, count)
    return out


class _CopyCountedRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, src: torch.Tensor, count: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return gather_rows(src, None, count, torch.empty_like(src))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: D102
        return grad, None


def copy_counted_rows(src: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """A copy of ``src`` whose first ``count`` rows are written (``count`` stays on the device; the
    rest, padding, is not), where ``clone()`` would copy every row; the gradient passes through."""
    return _CopyCountedRows.apply(src, count)


def gather_row_pairs(
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]],
    index: torch.Tensor | None = None,
    count: torch.Tensor | None = None,
) -> None:
    """:func:`gather_rows` into each ``out`` of the ``(src, out)`` pairs, with one ``index`` and
    ``count`` for all of them: the columns of a packed row are copied by one kernel launch per two
    pairs instead of one per column (each launch costs the host tens of microseconds).

    The sources may differ in width and dtype; each pair's ``out`` has its ``src``'s width and dtype
    and the gather's row count.
    """
    num_rows = pairs[0][0].shape[0] if index is None else index.numel()
    for src, out in pairs:
        if src.dim() != 2 or out.shape != (num_rows, src.shape[1]) or out.dtype != src.dtype:
            raise ValueError(
                f"gather_rows: src {tuple(src.shape)} {src.dtype} -> out {tuple(out.shape)} {out.dtype} "
                f"with {num_rows} rows to copy"
            )
    if not uses_kernel(pairs[0][0]):
        for src, out in pairs:
            out.copy_(src) if index is None else torch.index_select(src, 0, index, out=out)
        return
    if any(t.stride(1) != 1 for pair in pairs for t in pair):
        raise ValueError("gather_rows: rows must be contiguous (stride 1 along the last dimension)")
    for first in range(0, len(pairs), 2):
        _launch(pairs[first : first + 2], index, count, num_rows)


def _launch(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], index, count, num_rows: int) -> None:
    """One kernel launch for one or two pairs; the grid's rows per program follow the first pair."""
    (src, out), (src2, out2) = pairs[0], pairs[-1]
    block_cols = _column_block(src.shape[1])
    block_rows = max(1, _ELEMENTS_PER_PROGRAM // block_cols)
    grid = (max(1, -(-num_rows // block_rows)),)
    _kernel()[grid](
        src,
        out,
        src.shape[1],
        src.stride(0),
        out.stride(0),
        src2,
        out2,
        src2.shape[1],
        src2.stride(0),
        out2.stride(0),
        src if index is None else index,
        src if count is None else count,
        num_rows,
        HAS_INDEX=index is not None,
        HAS_COUNT=count is not None,
        HAS_SECOND=len(pairs) == 2,
        BLOCK_ROWS=block_rows,
        BLOCK_COLS=block_cols,
        BLOCK_COLS2=_column_block(src2.shape[1]),
        num_warps=4,
    )


def gather_sum_rows(rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``out[t] = sum_j rows[pos[t, j]]``, summed in fp32 from ``j = 0`` up and rounded once.

    The unpermutation of a top-k dispatch: each token's ``k`` expert rows are read and summed in one
    pass, instead of gathering a ``[tokens, k, hidden]`` copy and summing it (which writes and reads
    that copy once more). Elsewhere (CPU, no Triton) the gather-then-sum in torch, which also sums in
    fp32 and rounds once.
    """
    num_tokens, topk = pos.shape
    if not uses_kernel(rows) or rows.dim() != 2 or rows.stride(1) != 1:
        picked = rows.contiguous().index_select(0, pos.reshape(-1)).view(num_tokens, topk, rows.shape[-1])
        return picked.sum(dim=1)
    width = rows.shape[1]
    out = torch.empty(num_tokens, width, dtype=rows.dtype, device=rows.device)
    block_cols = _column_block(width)
    grid = (num_tokens, -(-width // block_cols))
    if num_tokens:
        _sum_kernel()[grid](
            rows,
            pos.contiguous(),
            out,
            width,
            rows.stride(0),
            out.stride(0),
            K=topk,
            BLOCK_COLS=block_cols,
            num_warps=4,
        )
    return out
