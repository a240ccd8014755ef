"""megatron-core's unfused chunk sort as one row gather (``model.moe_chunk_sort=gather``).

With more than one local expert and ``moe_permute_fusion=false``, megatron-core's alltoall dispatcher
reorders the rows it received, grouped by (source rank, local expert), into (local expert, source
rank) order, and back before the combine (``moe_utils.sort_chunks_by_idxs``): it splits the rows into
one view per chunk (EP x local experts: 128 at EP=16 with 8 experts a GPU) and concatenates them in
the new order, for the tokens and again for their probabilities. Each view is a host call, and
autograd's backward of the concatenation makes as many views again: counted on a CPU, 1,578 of the
1,645 operator calls a layer and micro-batch that the emulated EP=16 step makes beyond EP=1
(``docs/benchmarks/ep_emulated_cluster.md``).

:func:`sort_chunks_by_gather` gives the same rows in the same order from one index: the source row of
every output row, worked out with numpy from the chunk sizes (on the host in the unfused path, after
megatron-core's own device-to-host copy) and copied to the GPU once, then one ``index_select``
forward and one ``index_copy_`` backward (the index is a permutation, so every input row gets exactly
one gradient row). :func:`use_gather_chunk_sort` puts it in place of megatron-core's unfused version,
or puts megatron-core's back, for the process; the fused path (Transformer Engine's kernels) is
megatron-core's either way. Which one a run gets is the dispatch path's decision
(``models/dispatch/megatron_alltoall.py``, ``model.moe_chunk_sort``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

DISPATCHER_MODULE = "megatron.core.transformer.moe.token_dispatcher"


class _GatherRows(torch.autograd.Function):
    """``input[index]`` for a permutation ``index``: its backward writes each gradient row back once."""

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, index: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(index)
        ctx.rows = input.shape[0]
        return input.index_select(0, index)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (index,) = ctx.saved_tensors
        grad_input = grad.new_empty((ctx.rows, *grad.shape[1:]))
        grad_input.index_copy_(0, index, grad)
        return grad_input, None


def chunk_sort_index(split_sizes: torch.Tensor, sorted_idxs: torch.Tensor, rows: int) -> torch.Tensor:
    """The source row of each output row when the ``rows`` input rows, cut into chunks of
    ``split_sizes``, are put in the chunk order ``sorted_idxs``; worked out where ``split_sizes`` is."""
    if split_sizes.device.type == "cpu":
        return host_chunk_sort_index(split_sizes, sorted_idxs, rows)
    return device_chunk_sort_index(split_sizes, sorted_idxs, rows)


def host_chunk_sort_index(split_sizes: torch.Tensor, sorted_idxs: torch.Tensor, rows: int) -> torch.Tensor:
    """:func:`chunk_sort_index` with numpy, whose calls cost a fraction of torch's on small arrays."""
    sizes = split_sizes.reshape(-1).numpy().astype(np.int64)
    order = sorted_idxs.reshape(-1).cpu().numpy()
    taken = sizes[order]
    shift = np.repeat((np.cumsum(sizes) - sizes)[order] - (np.cumsum(taken) - taken), taken)
    return torch.from_numpy(np.arange(rows, dtype=np.int64) + shift)


def device_chunk_sort_index(split_sizes: torch.Tensor, sorted_idxs: torch.Tensor, rows: int) -> torch.Tensor:
    """:func:`chunk_sort_index` with torch on ``split_sizes``' device; nothing is read on the host (the
    total ``rows`` is the input's length)."""
    sizes = split_sizes.reshape(-1).to(torch.int64)
    order = sorted_idxs.reshape(-1).to(device=sizes.device, dtype=torch.int64)
    taken = sizes[order]
    starts = (torch.cumsum(sizes, 0) - sizes)[order] - (torch.cumsum(taken, 0) - taken)
    shift = torch.repeat_interleave(starts, taken, output_size=rows)
    return torch.arange(rows, device=sizes.device, dtype=torch.int64) + shift


def _on(index: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``index`` on ``device``, without making the host wait for the GPU's queue: from pageable host
    memory an asynchronous copy is staged at once and returns (a page-locked allocation per reorder,
    tried first, made the emulated step slower)."""
    if index.device == device:
        return index
    return index.to(device, non_blocking=True)


def sort_chunks_by_gather(
    input: torch.Tensor,
    split_sizes: torch.Tensor,
    sorted_idxs: torch.Tensor,
    probs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """megatron-core's unfused ``sort_chunks_by_idxs``: the same rows (and probabilities) in the same
    order, by one gather each."""
    if split_sizes.device.type == "cpu" and (total := int(split_sizes.sum())) != input.shape[0]:
        raise ValueError(f"chunk sort: the chunk sizes add up to {total} rows, the input has {input.shape[0]}")
    index = _on(chunk_sort_index(split_sizes, sorted_idxs, input.shape[0]), input.device)
    output = _GatherRows.apply(input, index)
    if probs is None:
        return output, None
    return output, _GatherRows.apply(probs, _on(index, probs.device))


def wrap_megatron_sort(original: Callable[..., Any]) -> Callable[..., Any]:
    """megatron-core's ``sort_chunks_by_idxs`` with its unfused branch replaced by the gather."""

    def sort_chunks_by_idxs(
        input: torch.Tensor,
        split_sizes: torch.Tensor,
        sorted_idxs: torch.Tensor,
        probs: torch.Tensor | None = None,
        fused: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if fused:
            return original(input, split_sizes, sorted_idxs, probs=probs, fused=fused)
        return sort_chunks_by_gather(input, split_sizes, sorted_idxs, probs)

    sort_chunks_by_idxs.megatron_original = original  # type: ignore[attr-defined]
    return sort_chunks_by_idxs


def use_gather_chunk_sort(gather: bool) -> None:
    """Make megatron-core's alltoall dispatcher reorder its chunks by :func:`sort_chunks_by_gather`
    (``gather``) or by its own ``sort_chunks_by_idxs`` for the process (the dispatcher calls the name
    its module imported; a process that trains several configs switches it at each build)."""
    if not gather and DISPATCHER_MODULE not in sys.modules:
        return  # never loaded, so never changed
    # Deferred: megatron-core's MoE modules load only for a model that has MoE layers.
    from megatron.core.transformer.moe import token_dispatcher

    current = token_dispatcher.sort_chunks_by_idxs
    original = getattr(current, "megatron_original", current)
    token_dispatcher.sort_chunks_by_idxs = wrap_megatron_sort(original) if gather else original


def current_chunk_sort() -> str:
    """Which chunk sort megatron-core's alltoall dispatcher calls now (what the tests check)."""
    if DISPATCHER_MODULE not in sys.modules:
        return "megatron"
    from megatron.core.transformer.moe import token_dispatcher

    return "gather" if hasattr(token_dispatcher.sort_chunks_by_idxs, "megatron_original") else "megatron"
