"""Grouped GEMMs over experts: ``torch._grouped_mm`` on Hopper bf16, a per-expert loop elsewhere.

Tokens arrive sorted by local expert (megatron-core's dispatchers permute them so) with
``tokens_per_expert`` rows each. Weights are stacked ``[E, out, in]`` like ``nn.Linear`` weights.
Rows past ``sum(tokens_per_expert)`` are padding (the EP>1 sorted dispatcher receives into a
buffer of static, worst-case size): they belong to no expert, their outputs are unspecified (zero on
the loop path) and they add nothing to weight gradients.

``GroupedLinearFunction`` owns the backward so that the weight-gradient GEMM can be deferred
(``delay_wgrad_compute``): the backward then returns only the input gradient and leaves
``(x, grad_out, offsets)`` with a ``WgradStash`` that ``compute()`` drains later.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Sequence

import torch

from megatron.bridge.models.torch_native.backends import GROUPED_GEMM_BACKENDS as BACKENDS
from megatron.bridge.models.torch_native.backends import fuses_wgrad_into_main_grad
from megatron.bridge.models.torch_native.wgrad_accumulate import accumulate_grouped_wgrad, can_fuse

_ALIGN_ROWS = 16


@functools.cache
def _device_has_grouped_mm(device_index: int) -> bool:
    """``torch._grouped_mm`` runs bf16 on CUDA compute capability 9.0 and newer."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    major, _ = torch.cuda.get_device_capability(device_index)
    return major >= 9


def select_backend(x: torch.Tensor, requested: str = "auto") -> str:
    """``requested`` (``model.torch_native_grouped_gemm_backend``), or for ``auto``: ``grouped_mm``
    for bf16 CUDA tensors on sm90+, ``loop`` otherwise (CPU, fp32, older GPUs)."""
    if requested not in BACKENDS:
        raise ValueError(f"grouped GEMM backend {requested!r} is not one of {BACKENDS}")
    if requested != "auto":
        return requested
    if x.is_cuda and x.dtype == torch.bfloat16 and _device_has_grouped_mm(x.device.index or 0):
        return "grouped_mm" if _unaligned_groups_ok(x.device.index or 0) else "grouped_mm_padded"
    return "loop"


@functools.cache
def _unaligned_groups_ok(device_index: int) -> bool:
    """Once per process: does ``torch._grouped_mm`` handle unaligned groups and a padding tail?

    Some torch builds required 16-row aligned groups, and the last offset may have to equal the
    row count; where a tiny probe (group sizes that are not multiples of 16, then 5 padding rows)
    fails or disagrees with per-expert matmuls, the ``grouped_mm_padded`` path pads each group.
    """
    dev = torch.device("cuda", device_index)
    g = torch.Generator(device="cpu").manual_seed(0)
    counts = torch.tensor([3, 0, 17, 1, 11])
    valid, tail = int(counts.sum()), 5
    x = torch.randn(valid + tail, 64, generator=g).to(dev, torch.bfloat16)
    w = torch.randn(len(counts), 32, 64, generator=g).to(dev, torch.bfloat16)
    dy = torch.randn(valid + tail, 32, generator=g).to(dev, torch.bfloat16)
    try:
        y = torch._grouped_mm(x, w.transpose(-2, -1), offs=_offsets(counts, dev)).float()[:valid]
        dw = torch._grouped_mm(dy.t(), x, offs=_offsets(counts, dev)).float()
    except Exception:
        return False
    ref = reference_grouped_linear(x[:valid].float(), w.float(), counts.tolist())
    chunks = torch.split(x[:valid].float(), counts.tolist())
    ref_dw = torch.stack([d.t() @ c for d, c in zip(torch.split(dy[:valid].float(), counts.tolist()), chunks)])
    ok_y = (y - ref).norm() <= 2e-2 * ref.norm()
    live = counts.to(dev) > 0
    ok_dw = (dw[live] - ref_dw[live]).norm() <= 2e-2 * ref_dw[live].norm()
    _EMPTY_GROUP_WGRAD_IS_ZERO[device_index] = bool(torch.count_nonzero(dw[~live]) == 0)
    return bool(ok_y and ok_dw)


# Per device: does the raw grouped wgrad already write zeros for experts without tokens? Then the
# masking pass (a read and write of the whole [E, out, in] gradient) is skipped.
_EMPTY_GROUP_WGRAD_IS_ZERO: dict = {}


def _strides_aligned(weight: torch.Tensor) -> bool:
    """``torch._grouped_mm`` needs 16-byte aligned row strides for every operand it sees."""
    size = weight.element_size()
    return all((d * size) % 16 == 0 for d in weight.shape[-2:])


def _split_sizes(counts: torch.Tensor, rows: int) -> list[int]:
    """Per-expert row counts on the host, plus the padding rows past them (if any)."""
    sizes = counts.tolist()
    tail = rows - sum(sizes)
    if tail < 0:
        raise ValueError(f"tokens_per_expert sums to {sum(sizes)} but only {rows} rows were given")
    return sizes + [tail] if tail else sizes


def _per_expert(chunks: Sequence[torch.Tensor], num_experts: int, fn) -> torch.Tensor:
    """``fn(e, chunk)`` per expert, concatenated, with zero rows for a padding tail."""
    out = [fn(e, c) for e, c in enumerate(chunks[:num_experts])]
    if len(chunks) > num_experts:
        tail = chunks[num_experts]
        out.append(tail.new_zeros(tail.shape[0], out[0].shape[1] if out else tail.shape[1]))
    return torch.cat(out, dim=0)


def _offsets(counts: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Exclusive-end offsets (int32) of each expert's rows, on the compute device."""
    return torch.cumsum(counts.to(device=device, dtype=torch.int64), dim=0).to(torch.int32)


def _padded_layout(counts: torch.Tensor, rows: int, device: torch.device):
    """Row map into a buffer where every group starts on a 16-row boundary (no host sync).

    Returns (destination row of each input row, padded offsets, buffer rows). The buffer size is a
    static bound (rows + 16 * groups) so the layout needs no device-to-host copy.
    """
    counts = counts.to(device=device, dtype=torch.int64)
    num_experts = counts.numel()
    # The padding tail (rows past the counts) is one more group, placed after the last offset.
    counts = torch.cat([counts, (rows - counts.sum()).view(1)])
    padded = (counts + _ALIGN_ROWS - 1) // _ALIGN_ROWS * _ALIGN_ROWS
    starts = torch.cumsum(counts, 0) - counts
    padded_starts = torch.cumsum(padded, 0) - padded
    expert_of_row = torch.repeat_interleave(torch.arange(num_experts + 1, device=device), counts, output_size=rows)
    row = torch.arange(rows, device=device)
    dest = padded_starts[expert_of_row] + (row - starts[expert_of_row])
    offsets = torch.cumsum(padded[:num_experts], 0).to(torch.int32)
    return dest, offsets, rows + _ALIGN_ROWS * (num_experts + 1)


def _scatter_rows(x: torch.Tensor, dest: torch.Tensor, buffer_rows: int) -> torch.Tensor:
    buf = x.new_zeros(buffer_rows, x.shape[1])
    buf.index_copy_(0, dest, x)
    return buf


def grouped_fprop(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor, backend: str) -> torch.Tensor:
    """``y[rows of e] = x[rows of e] @ w[e].T``; x ``[T, in]``, w ``[E, out, in]`` -> ``[T, out]``."""
    if backend == "grouped_mm":
        return torch._grouped_mm(x, w.transpose(-2, -1), offs=_offsets(counts, x.device))
    if backend == "grouped_mm_padded":
        dest, offs, n = _padded_layout(counts, x.shape[0], x.device)
        return torch._grouped_mm(_scatter_rows(x, dest, n), w.transpose(-2, -1), offs=offs)[dest]
    chunks = torch.split(x, _split_sizes(counts, x.shape[0]))
    return _per_expert(chunks, w.shape[0], lambda e, c: c @ w[e].t())


def grouped_dgrad(dy: torch.Tensor, w: torch.Tensor, counts: torch.Tensor, backend: str) -> torch.Tensor:
    """Input gradient: ``dx[rows of e] = dy[rows of e] @ w[e]``."""
    if backend == "grouped_mm":
        return torch._grouped_mm(dy, w, offs=_offsets(counts, dy.device))
    if backend == "grouped_mm_padded":
        dest, offs, n = _padded_layout(counts, dy.shape[0], dy.device)
        return torch._grouped_mm(_scatter_rows(dy, dest, n), w, offs=offs)[dest]
    chunks = torch.split(dy, _split_sizes(counts, dy.shape[0]))
    return _per_expert(chunks, w.shape[0], lambda e, c: c @ w[e])


def grouped_wgrad(
    dy: torch.Tensor, x: torch.Tensor, counts: torch.Tensor, backend: str, out_dtype: torch.dtype
) -> torch.Tensor:
    """Weight gradient ``dw[e] = dy[rows of e].T @ x[rows of e]`` -> ``[E, out, in]``.

    Experts that received no tokens get an exact zero (masked on the grouped path, so the result
    never depends on how the kernel treats empty groups).
    """
    num_experts = counts.numel()
    if backend in ("grouped_mm", "grouped_mm_padded"):
        if backend == "grouped_mm":
            dw = torch._grouped_mm(dy.t(), x, offs=_offsets(counts, dy.device))
        else:  # zero padding rows contribute nothing to dy^T x
            dest, offs, n = _padded_layout(counts, dy.shape[0], dy.device)
            dw = torch._grouped_mm(_scatter_rows(dy, dest, n).t(), _scatter_rows(x, dest, n), offs=offs)
        if not _EMPTY_GROUP_WGRAD_IS_ZERO.get(dw.device.index, False):
            empty = counts.to(device=dw.device) == 0
            dw.masked_fill_(empty.view(-1, 1, 1), 0)
        return dw.to(out_dtype)
    sizes = _split_sizes(counts, dy.shape[0])[:num_experts]
    dy_chunks = torch.split(dy[: sum(sizes)], sizes)
    x_chunks = torch.split(x[: sum(sizes)], sizes)
    dw = torch.stack([d.t() @ c for d, c in zip(dy_chunks, x_chunks)]) if num_experts else None
    return dw.to(out_dtype)


def fuses_into_main_grad(weight: torch.Tensor, accumulation: str) -> bool:
    """Whether this weight's gradient goes straight into its ``main_grad`` (see ``wgrad_accumulate``).

    ``accumulation`` is ``model.torch_native_wgrad_accumulation``; an explicit ``fused`` that cannot
    run on this ``main_grad`` is an error, not a silent fallback.
    """
    return fuses_wgrad_into_main_grad(weight, accumulation, can_fuse, "an fp32 CUDA main_grad and Triton")


def weight_gradient(
    dy: torch.Tensor, x: torch.Tensor, counts: torch.Tensor, weight: torch.Tensor, backend: str, fused: bool
) -> torch.Tensor:
    """The gradient autograd hands to ``weight``: the grouped GEMM's result, or, fused, a placeholder.

    Fused (:func:`fuses_into_main_grad`), the product is already in ``weight.main_grad`` and
    ``grad_added_to_main_grad`` tells DDP's hook not to add the placeholder (the hook still wants a
    gradient to see, so an uninitialised one of the right shape is returned, as megatron-core's
    fused linear layers do).
    """
    if fused:
        accumulate_grouped_wgrad(dy, x, counts, weight.main_grad)
        weight.grad_added_to_main_grad = True
        return torch.empty_like(weight)
    return grouped_wgrad(dy, x, counts, backend, weight.dtype)


class WgradStash:
    """FIFO of deferred weight-gradient work for one stacked weight (one entry per backward)."""

    def __init__(self) -> None:
        self.enabled = False
        self._pending: deque[tuple[torch.Tensor, torch.Tensor, torch.Tensor, str, str]] = deque()

    def push(self, dy: torch.Tensor, x: torch.Tensor, counts: torch.Tensor, backend: str, accumulation: str) -> None:
        self._pending.append((dy, x, counts, backend, accumulation))

    def __len__(self) -> int:
        return len(self._pending)

    def compute(self, weight: torch.nn.Parameter) -> bool:
        """Run the oldest deferred wgrad GEMM and accumulate it into ``weight.grad`` (or ``main_grad``).

        Returns False when nothing was pending (e.g. a layer whose backward did not run).
        """
        if not self._pending:
            return False
        dy, x, counts, backend, accumulation = self._pending.popleft()
        fused = fuses_into_main_grad(weight, accumulation)
        dw = weight_gradient(dy, x, counts, weight, backend, fused)
        if weight.grad is None or fused:  # fused: a placeholder, the gradient is in main_grad
            weight.grad = dw
        else:
            weight.grad.add_(dw)
        return True

    def clear(self) -> None:
        self._pending.clear()


class GroupedLinearFunction(torch.autograd.Function):
    """Autograd for a grouped, bias-free linear layer with an optional deferred weight gradient."""

    @staticmethod
    def forward(ctx, x, weight, counts, backend: str, stash: WgradStash | None, accumulation: str):  # noqa: D102
        ctx.save_for_backward(x, weight, counts)
        ctx.backend = backend
        ctx.stash = stash
        ctx.accumulation = accumulation
        return grouped_fprop(x, weight, counts, backend)

    @staticmethod
    def backward(ctx, dy):  # noqa: D102
        x, weight, counts = ctx.saved_tensors
        dy = dy.contiguous()
        dx = grouped_dgrad(dy, weight, counts, ctx.backend) if ctx.needs_input_grad[0] else None
        dw = None
        if ctx.needs_input_grad[1]:
            if ctx.stash is not None and ctx.stash.enabled:
                ctx.stash.push(dy, x, counts, ctx.backend, ctx.accumulation)
            else:
                fused = fuses_into_main_grad(weight, ctx.accumulation)
                dw = weight_gradient(dy, x, counts, weight, ctx.backend, fused)
        return dx, dw, None, None, None, None


def grouped_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    tokens_per_expert: torch.Tensor,
    backend: str = "auto",
    stash: WgradStash | None = None,
    wgrad_accumulation: str = "auto",
) -> torch.Tensor:
    """Grouped ``x @ weight[e].T`` over expert row blocks, differentiable in ``x`` and ``weight``.

    ``wgrad_accumulation`` (``model.torch_native_wgrad_accumulation``): where the weight has an fp32
    ``main_grad`` (megatron DDP), ``auto``/``fused`` add the weight gradient into it directly.
    """
    if x.dim() != 2 or weight.dim() != 3:
        raise ValueError(f"expected x [T, in] and weight [E, out, in], got {tuple(x.shape)}, {tuple(weight.shape)}")
    if tokens_per_expert.numel() != weight.shape[0]:
        raise ValueError(f"tokens_per_expert has {tokens_per_expert.numel()} entries for {weight.shape[0]} experts")
    backend = select_backend(x, backend)
    if backend.startswith("grouped_mm") and not _strides_aligned(weight):
        backend = "loop"
    return GroupedLinearFunction.apply(x.contiguous(), weight, tokens_per_expert, backend, stash, wgrad_accumulation)


def reference_grouped_linear(x: torch.Tensor, weight: torch.Tensor, tokens_per_expert: Sequence[int]) -> torch.Tensor:
    """Plain per-expert matmuls through autograd: the yardstick for tests and GPU self-checks."""
    chunks = torch.split(x, list(int(n) for n in tokens_per_expert))
    return torch.cat([c @ weight[e].t() for e, c in enumerate(chunks)], dim=0)
