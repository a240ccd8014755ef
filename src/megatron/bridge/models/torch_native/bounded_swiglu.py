"""SwiGLU times the routing probability over only the real rows of a padded expert buffer.

The EP>1 sorted dispatcher hands the experts a buffer of worst-case size (``ep_size * tokens *
min(top-k, local experts)`` rows: 524288 at EP=16, seq 4096, top-8), of which only
``tokens_per_expert.sum()`` rows are tokens, a count that lives on the GPU. The grouped GEMMs stop
at that count; an elementwise activation over the whole buffer would not (on an H200 it took 256 ms
of a 521 ms step). These Triton kernels read the count from device memory and loop over the real
rows only, so the host never waits for it:

* forward: ``out = silu(gate) * linear * prob`` in fp32, stored in ``h``'s dtype (``gate`` and
  ``linear`` are the two halves of ``h``'s last dimension);
* backward: with ``s = sigmoid(gate)``, ``d gate = g * linear * prob * s * (1 + gate * (1 - s))``,
  ``d linear = g * silu(gate) * prob`` and ``d prob = sum_j g * silu(gate) * linear``.

Rows at or past the count are padding: their outputs and their ``h`` gradients are left unwritten
(nothing reads them: the grouped GEMMs skip them), their ``prob`` gradients are zero.
"""

from __future__ import annotations

import torch

try:  # Triton is optional (CPU machines have none); callers ask available() first
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without Triton
    triton = None

_BLOCK_ROWS = 16
_BLOCK_COLS = 256
_PROGRAMS_PER_SM = 4


if triton is not None:

    @triton.jit
    def _row_block(block, valid, prob_ptr, BLOCK_ROWS: tl.constexpr):
        """Row block ``block``: its rows, which of them are below the count, their probs in fp32."""
        rows = block * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS).to(tl.int64)
        row_ok = rows < valid
        return rows, row_ok, tl.load(prob_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)

    @triton.jit
    def _tile(h_ptr, rows, row_ok, start, ffn, BLOCK_COLS: tl.constexpr):
        """One tile of the rows: where it lies in ``h`` and in an ``[rows, ffn]`` tensor, its mask,
        and its ``gate`` and ``linear`` halves in fp32."""
        cols = start + tl.arange(0, BLOCK_COLS)
        ok = row_ok[:, None] & (cols < ffn)[None, :]
        at = rows[:, None] * (2 * ffn) + cols[None, :]
        gate = tl.load(h_ptr + at, mask=ok, other=0.0).to(tl.float32)
        linear = tl.load(h_ptr + at + ffn, mask=ok, other=0.0).to(tl.float32)
        return at, rows[:, None] * ffn + cols[None, :], ok, gate, linear

    @triton.jit
    def _forward_kernel(
        h_ptr, prob_ptr, out_ptr, count_ptr, n_rows, ffn, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr
    ):
        valid = tl.minimum(tl.load(count_ptr).to(tl.int64), n_rows)
        for block in range(tl.program_id(0), tl.cdiv(valid, BLOCK_ROWS), tl.num_programs(0)):
            rows, row_ok, prob = _row_block(block, valid, prob_ptr, BLOCK_ROWS)
            for start in range(0, ffn, BLOCK_COLS):
                _, out_at, ok, gate, linear = _tile(h_ptr, rows, row_ok, start, ffn, BLOCK_COLS)
                out = gate * tl.sigmoid(gate) * linear * prob[:, None]
                tl.store(out_ptr + out_at, out.to(out_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def _backward_kernel(
        grad_ptr,
        h_ptr,
        prob_ptr,
        grad_h_ptr,
        grad_prob_ptr,
        count_ptr,
        n_rows,
        ffn,
        BLOCK_ROWS: tl.constexpr,
        BLOCK_COLS: tl.constexpr,
    ):
        valid = tl.minimum(tl.load(count_ptr).to(tl.int64), n_rows)
        for block in range(tl.program_id(0), tl.cdiv(valid, BLOCK_ROWS), tl.num_programs(0)):
            rows, row_ok, prob = _row_block(block, valid, prob_ptr, BLOCK_ROWS)
            grad_prob = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
            for start in range(0, ffn, BLOCK_COLS):
                at, grad_at, ok, gate, linear = _tile(h_ptr, rows, row_ok, start, ffn, BLOCK_COLS)
                grad = tl.load(grad_ptr + grad_at, mask=ok, other=0.0).to(tl.float32)
                sig = tl.sigmoid(gate)
                silu = gate * sig
                grad_prob += tl.sum(grad * silu * linear, axis=1)
                grad_gate = grad * linear * prob[:, None] * sig * (1.0 + gate * (1.0 - sig))
                grad_linear = grad * silu * prob[:, None]
                dtype = grad_h_ptr.dtype.element_ty
                tl.store(grad_h_ptr + at, grad_gate.to(dtype), mask=ok)
                tl.store(grad_h_ptr + at + ffn, grad_linear.to(dtype), mask=ok)
            tl.store(grad_prob_ptr + rows, grad_prob.to(grad_prob_ptr.dtype.element_ty), mask=row_ok)


def available() -> bool:
    """Whether the kernels can run here (Triton is importable)."""
    return triton is not None


def _programs(rows: int, device: torch.device) -> int:
    """A persistent grid: a few programs per SM, never more than there are row blocks."""
    blocks = max(1, -(-rows // _BLOCK_ROWS))
    if device.type != "cuda":
        return min(blocks, 4)
    return min(blocks, _PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count)


class _BoundedSwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, h: torch.Tensor, probs: torch.Tensor, count: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:  # noqa: D102
        h, probs, count = h.contiguous(), probs.contiguous(), count.reshape(1)
        rows, ffn = h.shape[0], h.shape[1] // 2
        if out is None:
            out = torch.empty(rows, ffn, dtype=h.dtype, device=h.device)
        _forward_kernel[(_programs(rows, h.device),)](
            h, probs, out, count, rows, ffn, BLOCK_ROWS=_BLOCK_ROWS, BLOCK_COLS=_BLOCK_COLS
        )
        ctx.save_for_backward(h, probs, count)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: D102
        h, probs, count = ctx.saved_tensors
        grad = grad.contiguous()
        grad_h = torch.empty_like(h)
        grad_probs = torch.zeros_like(probs)
        rows, ffn = h.shape[0], h.shape[1] // 2
        _backward_kernel[(_programs(rows, h.device),)](
            grad, h, probs, grad_h, grad_probs, count, rows, ffn, BLOCK_ROWS=_BLOCK_ROWS, BLOCK_COLS=_BLOCK_COLS
        )
        return grad_h, grad_probs, None, None


def bounded_swiglu_probs(
    h: torch.Tensor, probs: torch.Tensor, count: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``silu(gate) * linear * probs`` for the first ``count`` rows of ``h`` (``[rows, 2 * ffn]``;
    ``count``: a one-element integer tensor on ``h``'s device). ``out`` (tests): the buffer to write."""
    return _BoundedSwiGLU.apply(h, probs, count, out)
