"""Vocab-parallel cross-entropy that reads the bf16 logits once per pass.

megatron-core's unfused loss casts the ``[tokens, vocab]`` logits to fp32 (2.5 GB for 4096 tokens
of a 151,936-word vocabulary), then runs max, subtract, exp, sum and divide as separate kernels and
keeps the fp32 softmax for the backward; its backward scales and casts that tensor again. Here the
forward is one streaming pass per row (online max and sum of exponentials in fp32 registers, plus
the target logit) and the backward one pass that writes ``(softmax - onehot) * grad`` straight in
the logits' dtype. Only the logits (already alive) and one fp32 log-sum-exp per token are kept.

Tensor parallelism: each rank holds a vocabulary shard; the per-row max, sum and target logit are
combined with three all-reduces over the tensor-parallel group (the same maths as megatron-core's
``vocab_parallel_cross_entropy``, which this matches to fp32 rounding).

Backends: Triton kernels for CUDA tensors when Triton imports, a chunked PyTorch version elsewhere
(CPU, or ``model.torch_native_cross_entropy_backend=torch`` for A/B timing).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from megatron.bridge.models.torch_native.backends import CROSS_ENTROPY_BACKENDS as BACKENDS

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton ships with CUDA builds of torch
    triton = None

_TORCH_CHUNK_ELEMENTS = 1 << 26  # elements per chunk of the PyTorch path: at most 256 MiB of fp32


def select_backend(device_type: str, requested: str = "auto") -> str:
    """The backend for logits on ``device_type`` (``"cuda"``, ``"cpu"``, ...): ``requested``
    (``model.torch_native_cross_entropy_backend``), or for ``auto``: ``triton`` on CUDA (or under
    Triton's CPU interpreter) when Triton imports, ``torch`` otherwise."""
    if requested not in BACKENDS:
        raise ValueError(f"cross-entropy backend {requested!r} is not one of {BACKENDS}")
    if requested == "triton" and triton is None:
        raise RuntimeError("cross-entropy backend 'triton' was requested but triton does not import")
    if requested != "auto":
        return requested
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    return "triton" if triton is not None and (device_type == "cuda" or interpret) else "torch"


if triton is not None:
    _FLOOR = tl.constexpr(-3.0e38)

    @triton.jit
    def _row_stats_kernel(
        logits_ptr, target_ptr, max_ptr, sum_ptr, tgt_logit_ptr, row_stride, vocab, vocab_start, BLOCK: tl.constexpr
    ):
        """Per row: max logit, sum of exp(logit - max), and the target's logit (0 if off-shard)."""
        row = tl.program_id(0).to(tl.int64)
        base = logits_ptr + row * row_stride
        # A finite floor instead of -inf keeps lanes that have seen nothing free of inf - inf.
        run_max = tl.full([BLOCK], _FLOOR, tl.float32)
        run_sum = tl.zeros([BLOCK], tl.float32)
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(base + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
            new_max = tl.maximum(run_max, x)
            run_sum = run_sum * tl.exp(run_max - new_max) + tl.exp(x - new_max)
            run_max = new_max
        row_max = tl.max(run_max, axis=0)
        row_sum = tl.sum(run_sum * tl.exp(run_max - row_max), axis=0)
        target = tl.load(target_ptr + row) - vocab_start
        on_shard = (target >= 0) & (target < vocab)
        tgt = tl.load(base + target, mask=on_shard, other=0.0).to(tl.float32)
        tl.store(max_ptr + row, row_max)
        tl.store(sum_ptr + row, row_sum)
        tl.store(tgt_logit_ptr + row, tgt)

    @triton.jit
    def _grad_kernel(
        logits_ptr,
        grad_ptr,
        target_ptr,
        lse_ptr,
        grad_loss_ptr,
        row_stride,
        grad_row_stride,
        vocab,
        vocab_start,
        BLOCK: tl.constexpr,
    ):
        """grad[row] = (softmax(row) - onehot(target)) * grad_loss[row], in the logits' dtype."""
        row = tl.program_id(0).to(tl.int64)
        lse = tl.load(lse_ptr + row)
        scale = tl.load(grad_loss_ptr + row)
        target = tl.load(target_ptr + row) - vocab_start
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            live = cols < vocab
            x = tl.load(logits_ptr + row * row_stride + cols, mask=live, other=0.0).to(tl.float32)
            p = tl.exp(x - lse)
            p = tl.where(cols == target, p - 1.0, p)
            tl.store(grad_ptr + row * grad_row_stride + cols, (p * scale).to(grad_ptr.dtype.element_ty), mask=live)


_BLOCK = 4096
_NUM_WARPS = 8


def _rows_per_chunk(vocab: int) -> int:
    """Rows the PyTorch path handles at once, so its fp32 temporaries stay bounded."""
    return max(1, _TORCH_CHUNK_ELEMENTS // max(vocab, 1))


def _row_stats(
    rows: torch.Tensor, target: torch.Tensor, vocab_start: int, backend: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(max, sum of exp(x - max), target logit) per row of this rank's vocabulary shard, fp32."""
    n, vocab = rows.shape
    if backend == "triton":
        row_max = torch.empty(n, dtype=torch.float32, device=rows.device)
        row_sum = torch.empty_like(row_max)
        tgt = torch.empty_like(row_max)
        if n:
            _row_stats_kernel[(n,)](
                rows,
                target,
                row_max,
                row_sum,
                tgt,
                rows.stride(0),
                vocab,
                vocab_start,
                BLOCK=_BLOCK,
                num_warps=_NUM_WARPS,
            )
        return row_max, row_sum, tgt
    maxes, sums, tgts = [], [], []
    step = _rows_per_chunk(vocab)
    for lo in range(0, n, step):
        x = rows[lo : lo + step].float()
        local = target[lo : lo + step] - vocab_start
        on_shard = (local >= 0) & (local < vocab)
        m = x.max(dim=-1).values
        maxes.append(m)
        sums.append(torch.exp(x - m.unsqueeze(-1)).sum(dim=-1))
        picked = x.gather(-1, local.clamp(0, vocab - 1).unsqueeze(-1)).squeeze(-1)
        tgts.append(torch.where(on_shard, picked, torch.zeros_like(picked)))
    if not maxes:
        empty = rows.new_empty(0, dtype=torch.float32)
        return empty, empty.clone(), empty.clone()
    return torch.cat(maxes), torch.cat(sums), torch.cat(tgts)


def _logits_grad(
    rows: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, grad_loss: torch.Tensor, vocab_start: int, backend: str
) -> torch.Tensor:
    """(softmax - onehot) * grad_loss per row, in the logits' dtype."""
    n, vocab = rows.shape
    grad = torch.empty((n, vocab), dtype=rows.dtype, device=rows.device)
    if backend == "triton":
        if n:
            _grad_kernel[(n,)](
                rows,
                grad,
                target,
                lse,
                grad_loss,
                rows.stride(0),
                grad.stride(0),
                vocab,
                vocab_start,
                BLOCK=_BLOCK,
                num_warps=_NUM_WARPS,
            )
        return grad
    step = _rows_per_chunk(vocab)
    cols = torch.arange(vocab, device=rows.device)
    for lo in range(0, n, step):
        p = torch.exp(rows[lo : lo + step].float() - lse[lo : lo + step].unsqueeze(-1))
        onehot = cols.unsqueeze(0) == (target[lo : lo + step] - vocab_start).unsqueeze(-1)
        p = p - onehot.to(p.dtype)
        grad[lo : lo + step] = (p * grad_loss[lo : lo + step].unsqueeze(-1)).to(rows.dtype)
    return grad


def _combine_shards(
    row_max: torch.Tensor, row_sum: torch.Tensor, tgt: torch.Tensor, group: dist.ProcessGroup | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-sum-exp over the whole vocabulary and the target logit, across tensor-parallel shards."""
    if group is not None and dist.get_world_size(group) > 1:
        global_max = row_max.clone()
        dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)
        row_sum = row_sum * torch.exp(row_max - global_max)
        dist.all_reduce(row_sum, op=dist.ReduceOp.SUM, group=group)
        dist.all_reduce(tgt, op=dist.ReduceOp.SUM, group=group)
        row_max = global_max
    return row_max + torch.log(row_sum), tgt


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Loss per token; the backward rebuilds the softmax from the kept logits and log-sum-exp."""

    @staticmethod
    def forward(
        ctx, logits: torch.Tensor, target: torch.Tensor, group: dist.ProcessGroup | None, backend: str
    ) -> torch.Tensor:
        vocab = logits.shape[-1]
        rows = logits.reshape(-1, vocab)
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        flat_target = target.reshape(-1).contiguous()
        rank = dist.get_rank(group) if group is not None and dist.get_world_size(group) > 1 else 0
        vocab_start = rank * vocab
        row_max, row_sum, tgt = _row_stats(rows, flat_target, vocab_start, backend)
        lse, tgt = _combine_shards(row_max, row_sum, tgt, group)
        ctx.save_for_backward(rows, flat_target, lse)
        ctx.vocab_start, ctx.backend, ctx.logits_shape = vocab_start, backend, logits.shape
        return (lse - tgt).view(target.shape)

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        rows, flat_target, lse = ctx.saved_tensors
        grad_loss = grad_loss.reshape(-1).float().contiguous()
        grad = _logits_grad(rows, flat_target, lse, grad_loss, ctx.vocab_start, ctx.backend)
        return grad.view(ctx.logits_shape), None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, group: dist.ProcessGroup | None = None, backend: str = "auto"
) -> torch.Tensor:
    """Cross-entropy per token of ``logits [..., vocab_shard]`` against global ``target [...]`` ids.

    Returns fp32 losses shaped like ``target``. ``group`` is the tensor-parallel group whose ranks
    hold consecutive vocabulary shards (None or size 1: the whole vocabulary is local).
    """
    if logits.shape[:-1] != target.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and target {tuple(target.shape)} disagree")
    return _VocabParallelCrossEntropy.apply(logits, target, group, select_backend(logits.device.type, backend))
