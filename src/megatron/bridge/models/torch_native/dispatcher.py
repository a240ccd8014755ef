"""Sync-free token permutation for the torch-native MoE layer (EP=1, expert TP=1).

megatron-core's alltoall dispatcher permutes with ``masked_select``/``nonzero`` over the routing map
and copies the token counts to the host before the expert GEMMs: every MoE layer stalls the GPU
behind a host sync. With one expert-parallel rank none of that is needed:

* every token routes to exactly ``topk`` experts (megatron's top-k routers scatter ``topk`` ones per
  row), so the permuted buffer has the static size ``tokens * topk``;
* a stable sort of the flattened ``[tokens, topk]`` expert ids gives megatron's order exactly
  (expert-major, tokens ascending within an expert);
* ``tokens_per_expert`` stays on the device (``routing_map.sum(0)``) and feeds
  ``torch._grouped_mm``'s device offsets;
* permute and unpermute are both gathers (forward and backward), no ``index_add`` atomics: the
  unpermute sums each token's ``topk`` expert rows in expert order, which is also the order in
  which megatron's ``scatter_add`` adds them.

:class:`TorchNativeMoELayer` is megatron's ``MoELayer`` whose dispatcher is swapped for
:class:`SortedTokenDispatcher` when the configuration allows it (see :func:`fast_path_blockers`);
otherwise megatron's dispatcher stays and the reason is logged once
(``MBRIDGE_TORCH_NATIVE_SORTED_DISPATCH=0`` forces megatron's, for A/B timing). The dispatcher subclasses
megatron's ``MoEAlltoAllTokenDispatcher`` and implements the same six stage methods the MoE layer
and the fine-grained EP-overlap schedule call, so ``build_schedule_plan`` keeps working.
"""

from __future__ import annotations

import logging
import os
from typing import List, Tuple

import torch
from megatron.core.transformer.moe.moe_layer import MoELayer
from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher
from megatron.core.transformer.transformer_config import TransformerConfig

logger = logging.getLogger(__name__)

_REPORTED: set = set()


def fast_path_blockers(config: TransformerConfig, ep_size: int, tp_size: int) -> List[str]:
    """Why the sync-free dispatcher cannot replace megatron's (empty list: it can)."""
    checks = (
        (os.environ.get("MBRIDGE_TORCH_NATIVE_SORTED_DISPATCH", "1") == "0",
         "MBRIDGE_TORCH_NATIVE_SORTED_DISPATCH=0"),
        (config.moe_token_dispatcher_type != "alltoall", "dispatcher is not alltoall"),
        (ep_size != 1, f"expert parallel size {ep_size} > 1"),
        (tp_size != 1, f"expert tensor parallel size {tp_size} > 1"),
        (config.moe_expert_capacity_factor is not None, "token dropping (moe_expert_capacity_factor)"),
        (bool(config.moe_pad_expert_input_to_capacity), "moe_pad_expert_input_to_capacity"),
        (bool(config.moe_router_padding_for_quantization), "moe_router_padding_for_quantization"),
        (bool(config.moe_shared_expert_overlap), "moe_shared_expert_overlap"),
        (getattr(config, "moe_latent_size", None) is not None, "moe_latent_size"),
        (config.cuda_graph_impl != "none", "CUDA graphs"),
        (getattr(config, "transformer_impl", "") == "inference_optimized", "inference_optimized"),
    )
    return [why for blocked, why in checks if blocked]


def sorted_routing(routing_map: torch.Tensor, topk: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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


class _PermuteTokens(torch.autograd.Function):
    """``x[order // k]``; backward gathers each token's ``k`` rows and sums them (no atomics)."""

    @staticmethod
    def forward(ctx, x, src_token, pos):  # noqa: D102
        ctx.save_for_backward(pos)
        return x.index_select(0, src_token)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        (pos,) = ctx.saved_tensors
        return _gather_sum(grad, pos), None, None


class _UnpermuteTokens(torch.autograd.Function):
    """Sum of each token's ``k`` expert rows; backward is the forward permutation (a gather)."""

    @staticmethod
    def forward(ctx, y, src_token, pos):  # noqa: D102
        ctx.save_for_backward(src_token)
        return _gather_sum(y, pos)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        (src_token,) = ctx.saved_tensors
        return grad.contiguous().index_select(0, src_token), None, None


def _gather_sum(rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``out[t] = sum_j rows[pos[t, j]]`` summed left to right in ``j`` (expert order)."""
    num_tokens, topk = pos.shape
    picked = rows.contiguous().index_select(0, pos.reshape(-1)).view(num_tokens, topk, rows.shape[-1])
    return picked.sum(dim=1)


def permute_sorted(x: torch.Tensor, routing_map: torch.Tensor, probs: torch.Tensor, topk: int):
    """Tokens and probs in megatron's permuted order, plus what :func:`unpermute_sorted` needs."""
    expert_idx, order, pos = sorted_routing(routing_map, topk)
    src_token = torch.div(order, topk, rounding_mode="floor")
    tokens = _PermuteTokens.apply(x, src_token, pos)
    permuted_probs = probs.gather(1, expert_idx).reshape(-1).index_select(0, order)
    return tokens, permuted_probs, (src_token, pos)


def unpermute_sorted(y: torch.Tensor, state: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Inverse of :func:`permute_sorted` for the tokens: sums each token's expert outputs."""
    src_token, pos = state
    return _UnpermuteTokens.apply(y, src_token, pos)


class SortedTokenDispatcher(MoEAlltoAllTokenDispatcher):
    """Alltoall dispatcher for one EP rank: static-size sorted permutation, counts stay on device."""

    def dispatch_preprocess(self, hidden_states: torch.Tensor, routing_map: torch.Tensor, probs: torch.Tensor):
        """Permute tokens and probs by expert (no communication, no host sync)."""
        self.hidden_shape = hidden_states.shape
        self.probs = probs
        self.routing_map = routing_map
        tokens = hidden_states.view(-1, self.hidden_shape[-1])
        self.hidden_shape_before_permute = tokens.shape
        self.tokens_per_expert = routing_map.sum(dim=0).long()
        if not tokens.is_cuda:  # free on the host: guard the exactly-top-k invariant
            total = int(self.tokens_per_expert.sum())
            if total != tokens.shape[0] * self.config.moe_router_topk:
                raise RuntimeError(f"routing map selects {total} token-expert pairs, expected "
                                   f"{tokens.shape[0]} tokens x top-{self.config.moe_router_topk}")
        permuted, permuted_probs, self._perm_state = permute_sorted(
            tokens, routing_map, probs, self.config.moe_router_topk
        )
        return permuted, permuted_probs

    def token_dispatch(self, permutated_local_input_tokens, permuted_probs):
        """One EP rank: nothing to exchange."""
        return permutated_local_input_tokens, permuted_probs

    def dispatch_postprocess(self, global_input_tokens, global_probs):
        """Tokens are already sorted by (local == global) expert; counts stay on the device."""
        tokens_per_expert, self.tokens_per_expert = self.tokens_per_expert, None
        return global_input_tokens, tokens_per_expert, global_probs

    def combine_preprocess(self, hidden_states):
        """Nothing to unsort or reduce-scatter with one EP and one expert-TP rank."""
        return hidden_states

    def token_combine(self, hidden_states, async_finish: bool = True, allocate_on_comm_stream: bool = True):
        """One EP rank: nothing to exchange."""
        return hidden_states

    def combine_postprocess(self, permutated_local_input_tokens):
        """Sum each token's expert outputs (gather, no atomics) and restore the input shape."""
        output = unpermute_sorted(permutated_local_input_tokens, self._perm_state)
        self._perm_state = None
        return output.view(self.hidden_shape)


class TorchNativeMoELayer(MoELayer):
    """megatron's ``MoELayer`` with :class:`SortedTokenDispatcher` where it applies."""

    def __init__(self, config: TransformerConfig, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        old = self.token_dispatcher
        blockers = fast_path_blockers(config, old.ep_size, old.tp_size)
        if not blockers:
            self.token_dispatcher = SortedTokenDispatcher(
                self.num_local_experts, self.local_expert_indices, config=config,
                pg_collection=_DispatcherGroups(old),
            )
        key = tuple(blockers)
        if key not in _REPORTED:
            _REPORTED.add(key)
            if blockers:
                logger.info("torch_native MoE: megatron's %s dispatcher (sync-free permutation off: %s)",
                            config.moe_token_dispatcher_type, "; ".join(blockers))
            else:
                logger.info("torch_native MoE: sync-free sorted token permutation (EP=1)")


class _DispatcherGroups:
    """The process groups megatron's dispatcher was built with, in ``ProcessGroupCollection`` shape."""

    def __init__(self, dispatcher: MoEAlltoAllTokenDispatcher):
        self.ep = dispatcher.ep_group
        self.expt_tp = dispatcher.tp_group
        self.tp_ep = dispatcher.tp_ep_group
