"""Sync-free token dispatch for the torch-native MoE layer.

megatron-core's alltoall dispatcher permutes with ``masked_select``/``nonzero`` over the routing map,
copies the token counts to the host before every all-to-all (``all_to_all_single`` wants host split
sizes) and, with more than one expert-parallel rank, re-sorts the received tokens by expert with a
host-side loop over ``ep_size * num_local_experts`` chunks. Every MoE layer stalls the host behind
the GPU, so the host never gets ahead and megatron's combined-1F1B schedule has little queued to
overlap the all-to-all with. Here the host only enqueues work:

* the permutation is a static-size sorted one (:mod:`sorted_permutation`): megatron's order exactly
  (expert-major, tokens ascending within an expert), which is also destination-rank-major;
* counts stay on the device, and every index a micro-batch needs before a token moves comes from one
  function, replayed from a CUDA graph on GPUs (:mod:`index_graph`).

With one expert-parallel rank (:class:`SortedTokenDispatcher`) nothing is exchanged. With several
(:class:`ExpertParallelSortedDispatcher`; the exchange and its plan are in :mod:`sorted_exchange`) the
per-expert counts are all-gathered over the EP group
(a fixed-size collective: no host copy), rows travel through a :class:`RowExchange` into a buffer
sized for the worst case (``ep_size * tokens * min(topk, local experts)`` rows, so no token is ever
dropped), and the copy out of that buffer is a device-side gather that also re-sorts them by local
expert (megatron's order after its second permutation); the combine packs them back the same way.
The experts' side holds the worst case too, or the per-rank budget of
``model.torch_native_rank_capacity_factor`` (``expert_rows.py``: a micro-batch over it stops the
step). Rows past the received total are padding: the experts' GEMMs and activation skip them
(``tokens_per_expert`` does not cover them) and nothing sends them back.

The dispatchers implement megatron's six stage methods (see :mod:`dispatcher_base`); state the backward
needs lives in autograd contexts, so a forward of the next micro-batch may run between a forward and its
backward. The dispatch paths that build them are ``models/dispatch/sorted_dispatch.py`` and
``sorted_nvshmem.py``.
"""

from __future__ import annotations

import torch

from megatron.bridge.models.torch_native import expert_rows
from megatron.bridge.models.torch_native.dispatcher_base import TorchNativeTokenDispatcher
from megatron.bridge.models.torch_native.row_gather import copy_counted_rows
from megatron.bridge.models.torch_native.sorted_exchange import (
    CombineExchange,
    DispatchExchange,
    ExchangePlan,
    graphed_routing_and_plan,
    make_plan,
    shared_exchange,
)
from megatron.bridge.models.torch_native.sorted_permutation import (
    graphed_routing_indices,
    permute_with,
    unpermute_sorted,
)
from megatron.bridge.models.torch_native.streams import stream_of
from megatron.bridge.models.torch_native.token_exchange import RowExchange, row_bytes

# ------------------------------------------------------------------------------ EP = 1


def _check_exactly_topk(tokens_per_expert: torch.Tensor, num_tokens: int, topk: int) -> None:
    """Free on the host (CPU tensors): guard the every-token-has-``topk``-experts invariant."""
    total = int(tokens_per_expert.sum())
    if total != num_tokens * topk:
        raise RuntimeError(f"routing map selects {total} token-expert pairs, expected {num_tokens} tokens x top-{topk}")


class SortedTokenDispatcher(TorchNativeTokenDispatcher):
    """Alltoall dispatcher for one EP rank: static-size sorted permutation, counts stay on device."""

    def dispatch_preprocess(self, hidden_states: torch.Tensor, routing_map: torch.Tensor, probs: torch.Tensor):
        """Permute tokens and probs by expert (no communication, no host sync)."""
        tokens = self.keep_input(hidden_states, routing_map, probs)
        src_token, pos, prob_index, self.tokens_per_expert = graphed_routing_indices(
            routing_map, topk=self.config.moe_router_topk
        )
        if not tokens.is_cuda:
            _check_exactly_topk(self.tokens_per_expert, tokens.shape[0], self.config.moe_router_topk)
        permuted, permuted_probs, self._perm_state = permute_with(tokens, probs, src_token, pos, prob_index)
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


# ------------------------------------------------------------------------------ EP > 1


class ExpertParallelSortedDispatcher(TorchNativeTokenDispatcher):
    """Alltoall dispatcher for EP > 1 (expert TP = 1) with device-side counts and static buffers."""

    def __init__(self, *args, transport: str, rank_capacity_factor: float | None = None, **kwargs) -> None:
        """``rank_capacity_factor``: the experts hold that many times a balanced rank's rows
        (``None``: the worst case; see ``expert_rows.py``)."""
        super().__init__(*args, **kwargs)
        self.transport = transport
        self.rank_capacity_factor = rank_capacity_factor
        self._plan: ExchangePlan | None = None

    def _exchange(self, device: torch.device) -> RowExchange:
        return shared_exchange(self.ep_group, self.transport, device)

    def _rows(self, num_tokens: int) -> tuple[int, int]:
        """``(capacity, expert rows)``: the worst-case rows one rank can receive (the exchange's
        buffers), and the rows the experts hold (the budget, at most that)."""
        shape = (self.ep_size, num_tokens, self.config.moe_router_topk, self.num_local_experts)
        return expert_rows.worst_case_rows(*shape), expert_rows.budget_rows(*shape, self.rank_capacity_factor)

    def dispatch_preprocess(self, hidden_states: torch.Tensor, routing_map: torch.Tensor, probs: torch.Tensor):
        """Permute by (global) expert, gather every rank's per-expert counts, plan the exchange."""
        tokens = self.keep_input(hidden_states, routing_map, probs)
        counts = routing_map.sum(dim=0).long()
        if not tokens.is_cuda:
            _check_exactly_topk(counts, tokens.shape[0], self.config.moe_router_topk)
        all_counts = self._exchange(counts.device).all_gather(counts)
        num_tokens, topk = tokens.shape[0], self.config.moe_router_topk
        capacity, held = self._rows(num_tokens)
        src_token, pos, prob_index, *plan = graphed_routing_and_plan(
            routing_map,
            all_counts,
            topk=topk,
            rank=self.ep_rank,
            num_local_experts=self.num_local_experts,
            capacity=capacity,
            expert_rows=held,
            with_calls=self.transport == "nvshmem",
        )
        # Under EP overlap the exchanges and the unpermutation run on the communication stream.
        overlap = bool(self.config.overlap_moe_expert_parallel_comm)
        made_on = stream_of(tokens) if overlap else None
        self._plan = make_plan(tuple(plan), capacity, send_rows=num_tokens * topk, made_on=made_on)
        if held < capacity:
            expert_rows.STEP_PEAK.note(self._plan.peak_rows, held, num_tokens * topk)
        permuted, permuted_probs, self._perm_state = permute_with(
            tokens,
            probs,
            src_token,
            pos,
            prob_index,
            unpermute_elsewhere=overlap,
        )
        return permuted, permuted_probs

    def _row_bytes(self, tokens: torch.Tensor, probs: torch.Tensor) -> int:
        # One row layout for dispatch and combine, so they share one set of buffers.
        return row_bytes([(tokens.shape[1], tokens.dtype), (1, probs.dtype)])

    def token_dispatch(self, permutated_local_input_tokens, permuted_probs):
        """Send each token row (with its prob) to the rank of its expert; counts stay on device."""
        tokens, probs = permutated_local_input_tokens, permuted_probs
        self._nbytes = self._row_bytes(tokens, probs)
        return DispatchExchange.apply(tokens, probs, self._plan, self._exchange(tokens.device), self._nbytes)

    def dispatch_postprocess(self, global_input_tokens, global_probs):
        """The received rows are already in megatron's order (by local expert); padding rows last.

        Under the combined-1F1B schedule the received rows are copied (not the padding): that
        schedule frees this stage's input after the forward, while the experts keep theirs.
        """
        tokens = global_input_tokens
        if self.config.overlap_moe_expert_parallel_comm:
            tokens = copy_counted_rows(tokens, self._plan.held_total)
        return tokens, self._plan.tokens_per_expert, global_probs

    def combine_preprocess(self, hidden_states):
        """Nothing to do: the combine packs the rows back into source-rank order as it sends them."""
        return hidden_states

    def token_combine(self, hidden_states, async_finish: bool = True, allocate_on_comm_stream: bool = True):
        """Send the expert outputs back; rows arrive in this rank's permuted order."""
        return CombineExchange.apply(hidden_states, self._plan, self._exchange(hidden_states.device), self._nbytes)

    def combine_postprocess(self, permutated_local_input_tokens):
        """Sum each token's expert outputs (gather, no atomics) and restore the input shape."""
        output = unpermute_sorted(permutated_local_input_tokens, self._perm_state)
        self._perm_state, self._plan = None, None
        return output.view(self.hidden_shape)
