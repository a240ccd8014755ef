"""Sorted permutation of the torch-native MoE dispatchers: routing map -> permuted rows and back.

Every token routes to exactly ``topk`` experts (megatron's top-k routers scatter ``topk`` ones per
row), so the permuted buffer has the static size ``tokens * topk``, and a stable sort of the
flattened ``[tokens, topk]`` expert ids gives megatron's order exactly (expert-major, tokens
ascending within an expert). Permute and unpermute are gathers in both directions (no atomics); the
unpermute sums each token's ``topk`` expert rows in expert order, as megatron's ``scatter_add``.
The indices are computed by one function of the routing map, replayed from a CUDA graph on GPUs
(:mod:`index_graph`).
"""

from __future__ import annotations

from typing import Optional

import torch

from megatron.bridge.models.torch_native.index_graph import GraphedIndexFunction
from megatron.bridge.models.torch_native.row_gather import gather_sum_rows
from megatron.bridge.models.torch_native.streams import record_if_read_elsewhere, stream_of


def sorted_routing(routing_map: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(expert_idx [T, k] ascending per token, order [T*k], pos [T, k])`` without host syncs.

    ``order[i]`` is the flat ``token * k + slot`` index of permuted row ``i`` (megatron's order);
    ``pos[t, j]`` is the permuted row that holds token ``t``'s ``j``-th expert (its inverse).
    """
    num_tokens = routing_map.shape[0]
    expert_idx = torch.topk(routing_map.to(torch.float32), topk, dim=1, sorted=False).indices
    expert_idx = torch.sort(expert_idx, dim=1).values
    order = torch.sort(expert_idx.reshape(-1), stable=True).indices
    pos = torch.empty_like(order)
    pos.scatter_(0, order, torch.arange(order.numel(), device=order.device))
    return expert_idx, order, pos.view(num_tokens, topk)


PermState = tuple[torch.Tensor, torch.Tensor, Optional["torch.cuda.Stream"]]
"""What :func:`unpermute_sorted` needs: ``src_token``, ``pos`` and, where the unpermutation may run
on another stream, the stream they were made on."""


class _PermuteTokens(torch.autograd.Function):
    """``x[order // k]``; backward gathers each token's ``k`` rows and sums them (no atomics)."""

    @staticmethod
    def forward(ctx, x, src_token, pos):  # noqa: D102
        ctx.save_for_backward(pos)
        return x.index_select(0, src_token)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        (pos,) = ctx.saved_tensors
        return gather_sum_rows(grad, pos), None, None


class _UnpermuteTokens(torch.autograd.Function):
    """Sum of each token's ``k`` expert rows; backward is the forward permutation (a gather)."""

    @staticmethod
    def forward(ctx, y, src_token, pos, made_on):  # noqa: D102
        ctx.save_for_backward(src_token)
        # Under EP overlap this (and so the backward) runs on the communication stream: one record
        # per stream covers the backward's read of src_token too.
        record_if_read_elsewhere(made_on, pos, src_token)
        return gather_sum_rows(y, pos)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        (src_token,) = ctx.saved_tensors
        return grad.contiguous().index_select(0, src_token), None, None, None


def permutation_indices(routing_map: torch.Tensor, topk: int) -> tuple[torch.Tensor, ...]:
    """The index tensors of a sorted permutation, computed on the device from the routing map alone.

    ``(src_token [T*k], pos [T, k], prob_index [T*k])``: permuted row ``i`` holds token
    ``src_token[i]`` and its probability ``probs.reshape(-1)[prob_index[i]]``; ``pos`` is
    :func:`sorted_routing`'s inverse for the unpermutation.
    """
    num_experts = routing_map.shape[1]
    expert_idx, order, pos = sorted_routing(routing_map, topk)
    src_token = torch.div(order, topk, rounding_mode="floor")
    prob_index = src_token * num_experts + expert_idx.reshape(-1).index_select(0, order)
    return src_token, pos, prob_index


def routing_indices(routing_map: torch.Tensor, topk: int) -> tuple[torch.Tensor, ...]:
    """:func:`permutation_indices` and ``tokens_per_expert [E]``: everything the EP=1 dispatcher
    computes before it moves a token."""
    return (*permutation_indices(routing_map, topk), routing_map.sum(dim=0).long())


# one CUDA graph per (tokens, experts, top-k): replayed with three launches instead of about a dozen
graphed_routing_indices = GraphedIndexFunction(routing_indices, "sorted routing indices")


def permute_with(
    x: torch.Tensor,
    probs: torch.Tensor,
    src_token: torch.Tensor,
    pos: torch.Tensor,
    prob_index: torch.Tensor,
    unpermute_elsewhere: bool = False,
):
    """Tokens and probs in permuted order from :func:`permutation_indices`' tensors, plus what
    :func:`unpermute_sorted` needs. ``unpermute_elsewhere``: the unpermutation may run on another
    stream (the EP-overlap schedule), so the indices remember the stream that made them."""
    tokens = _PermuteTokens.apply(x, src_token, pos)
    permuted_probs = probs.reshape(-1).index_select(0, prob_index)
    return tokens, permuted_probs, (src_token, pos, stream_of(src_token) if unpermute_elsewhere else None)


def permute_sorted(x: torch.Tensor, routing_map: torch.Tensor, probs: torch.Tensor, topk: int):
    """Tokens and probs in megatron's permuted order, plus what :func:`unpermute_sorted` needs."""
    src_token, pos, prob_index, _ = graphed_routing_indices(routing_map, topk=topk)
    return permute_with(x, probs, src_token, pos, prob_index)


def unpermute_sorted(y: torch.Tensor, state: PermState) -> torch.Tensor:
    """Inverse of :func:`permute_sorted` for the tokens: sums each token's expert outputs."""
    src_token, pos, made_on = state
    return _UnpermuteTokens.apply(y, src_token, pos, made_on)
