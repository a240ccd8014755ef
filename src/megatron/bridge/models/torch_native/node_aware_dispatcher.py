"""Node-aware MoE token dispatch: one copy of a token per destination node, then fan-out inside it.

megatron-core's alltoall dispatcher sends one row per (token, expert) pair to the expert's rank: a
token whose top-k experts sit on four GPUs of one remote node crosses the inter-node link four times.
Here (``model.torch_native_dispatcher=node_aware``, EP over ``nodes x per_node`` ranks, see
:mod:`node_groups`) the dispatch takes two hops:

(a) *between nodes*: each token goes once to every node that owns one of its experts, to the rank
    there with the sender's local index (an all-to-all over the sender's rail); with it travel its
    expert slots on that node (``min(topk, experts per node)`` ids within the node, -1 for none)
    and their routing probabilities. Rows are grouped by destination node, tokens ascending.
(b) *inside the node*: the receiving GPU turns each arrived token into one row per expert slot and
    sends the rows to the GPUs that own those experts (an all-to-all over the node's group).

The expert GPU reorders what it received into megatron's order (by local expert, then source EP
rank, then token), so the experts see the very rows, probabilities and ``tokens_per_expert`` of
megatron's dispatcher. The combine runs in reverse: expert outputs (already weighted by their
probabilities inside the experts) go back to the receiving GPU of hop (a), which sums each token's
rows of its node *before* the inter-node hop, in expert order; one row per (token, node) crosses
back, and the token's rank sums its nodes' rows in node order. Summation order is the only
numerical difference from megatron's dispatcher (which adds a token's ``k`` rows one by one in
expert order): equal where a token has several experts on at most one node, a rounding apart
otherwise.

Split sizes reach the host once per dispatch: the per-expert and per-node counts of every EP rank
are all-gathered over the EP group and copied to the host, and every split and index of both hops
follows from them (``all_to_all_single`` wants host split sizes, as megatron's dispatcher does).
With one node (EP inside a node) hop (a) keeps every token on its rank; with one GPU per node hop
(b) keeps every row on its rank.

The six stage methods are the ones megatron's MoE layer and combined-1F1B EP-overlap schedule call
(``build_schedule_plan`` keeps working; see :mod:`dispatcher_base`); what a backward needs lives in
autograd contexts, so a forward of the next micro-batch may run between a forward and its backward.
Gathers run in both directions (no atomics): a row copied to several places sums its gradients back
by a gather.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from megatron.bridge.models.torch_native.dispatcher_base import TorchNativeTokenDispatcher
from megatron.bridge.models.torch_native.node_groups import NodeGroups, NodeLayout, node_groups
from megatron.bridge.models.torch_native.row_gather import gather_sum_rows
from megatron.bridge.models.torch_native.streams import record_if_read_elsewhere, stream_of
from megatron.bridge.models.torch_native.token_exchange import exclusive_cumsum

# ------------------------------------------------------------------------------ split sizes


@dataclass(frozen=True)
class Splits:
    """Host split sizes of both hops for one dispatch, and the rows hop (b) brings this rank."""

    send_a: list[int]  # copies to each node (over the rail)
    recv_a: list[int]  # copies from each node
    send_b: list[int]  # expert rows to each GPU of the node
    recv_b: list[int]  # expert rows from each GPU of the node
    arrivals: torch.Tensor  # [per_node, local experts, nodes]: rows by (source GPU, local expert, source node)


def stage_splits(all_counts: torch.Tensor, layout: NodeLayout, num_local_experts: int) -> Splits:
    """Both hops' split sizes from the gathered host counts ``all_counts[s]`` of EP rank ``s``:
    tokens per global expert, then tokens per node (each token once per node it routes to)."""
    nodes, per_node, node, local = layout.nodes, layout.per_node, layout.node, layout.local
    experts = nodes * per_node * num_local_experts
    # [source node, source local, destination node, destination local, local expert]
    per_expert = all_counts[:, :experts].reshape(nodes, per_node, nodes, per_node, num_local_experts)
    per_node_hits = all_counts[:, experts:].reshape(nodes, per_node, nodes)
    to_me = per_expert[:, :, node, local]  # [source node, source local, local expert]
    return Splits(
        send_a=per_node_hits[node, local].tolist(),
        recv_a=per_node_hits[:, local, node].tolist(),
        send_b=per_expert[:, local, node].sum(dim=(0, 2)).tolist(),
        recv_b=to_me.sum(dim=(0, 2)).tolist(),
        arrivals=to_me.permute(1, 2, 0).contiguous(),
    )


# ------------------------------------------------------------------------------ indices


def node_copies(node_hit: torch.Tensor, total: int, width: int) -> tuple[torch.Tensor, ...]:
    """Hop (a)'s send rows from ``node_hit [tokens, nodes]`` (``total`` hits in all).

    Returns ``(token, node, pos)``: the token and destination node of each send row (node-major,
    tokens ascending), and ``pos [tokens, width]``: each token's rows in node order, padded with
    ``total`` (a zero row) up to ``width = min(topk, nodes)``.
    """
    num_tokens, nodes = node_hit.shape
    missed = (~node_hit).t().reshape(-1).to(torch.int32)  # node-major
    order = torch.sort(missed, stable=True).indices  # the hits first, node-major, tokens ascending
    row = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    pos = row.view(nodes, num_tokens).t().sort(dim=1).values[:, :width].clamp(max=total)
    sent = order[:total]
    return sent % num_tokens, sent // num_tokens, pos


def copy_slots(
    routing_map: torch.Tensor, token: torch.Tensor, node: torch.Tensor, nodes: int, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each send row's experts on its node: ``(slots [rows, width], prob_index [rows * width])``.

    ``slots`` holds expert ids within the node (int32), ascending, -1 for an empty slot; ``prob_index``
    where each slot's probability sits in ``probs.reshape(-1)`` (``tokens * experts``, one past the
    end, for an empty slot: the caller appends a zero there).
    """
    num_tokens, num_experts = routing_map.shape
    per_node = num_experts // nodes
    routed = routing_map.view(num_tokens, nodes, per_node)[token, node]  # [rows, experts per node]
    ids = torch.arange(per_node, device=routing_map.device)
    key = torch.where(routed, ids, per_node).sort(dim=1).values[:, :width]
    valid = key < per_node
    flat = token[:, None] * num_experts + node[:, None] * per_node + key
    prob_index = torch.where(valid, flat, num_tokens * num_experts).reshape(-1)
    return torch.where(valid, key, -1).to(torch.int32), prob_index


def fan_out(slots: torch.Tensor, per_node_experts: int, total: int) -> tuple[torch.Tensor, ...]:
    """Hop (b)'s send rows from the arrived copies' ``slots [copies, width]`` (``total`` used slots).

    Returns ``(copy, slot, pos)``: the arrived copy and the flat slot of each expert row (by expert
    within the node, which is destination-GPU-major, copies ascending), and ``pos [copies, width]``:
    each copy's expert rows in expert order, ``total`` (a zero row) for an empty slot.
    """
    copies, width = slots.shape
    key = torch.where(slots >= 0, slots, per_node_experts).reshape(-1)
    order = torch.sort(key, stable=True).indices
    row = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    pos = torch.where(slots >= 0, row.view(copies, width), total)
    sent = order[:total]
    return torch.div(sent, width, rounding_mode="floor"), sent, pos


def expert_order(arrivals: torch.Tensor, total: int) -> torch.Tensor:
    """For each row in megatron's order (local expert, source node, source GPU, token), the
    received row holding it; rows arrive by (source GPU, local expert, source node, token) and
    ``arrivals`` holds those segments' sizes."""
    starts = exclusive_cumsum(arrivals.reshape(-1)).view_as(arrivals)
    sizes = arrivals.permute(1, 2, 0).reshape(-1)
    firsts = starts.permute(1, 2, 0).reshape(-1)
    segment = torch.repeat_interleave(torch.arange(sizes.numel(), device=sizes.device), sizes, output_size=total)
    offset = torch.arange(total, device=sizes.device) - (torch.cumsum(sizes, 0) - sizes)[segment]
    return firsts[segment] + offset


def inverse(index: torch.Tensor) -> torch.Tensor:
    """The inverse of the permutation ``index``."""
    return torch.empty_like(index).scatter_(0, index, torch.arange(index.numel(), device=index.device))


# ------------------------------------------------------------------------------ autograd pieces


def _sum_rows(rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``out[i] = sum_j rows[pos[i, j]]`` in ``j`` order, where ``rows.shape[0]`` is a zero row."""
    padded = torch.cat([rows.contiguous(), rows.new_zeros(1, rows.shape[1])])
    return gather_sum_rows(padded, pos)


class _Replicate(torch.autograd.Function):
    """``x[src]``: rows copied to several places; the backward sums each row's copies (gather)."""

    @staticmethod
    def forward(ctx, x, src, pos):  # noqa: D102
        ctx.save_for_backward(pos)
        return x.index_select(0, src)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        (pos,) = ctx.saved_tensors
        return _sum_rows(grad, pos), None, None


class _SumCopies(torch.autograd.Function):
    """Sums the copies of each row (``pos``); the backward hands each copy its row's gradient."""

    @staticmethod
    def forward(ctx, rows, pos, dst):  # noqa: D102
        ctx.save_for_backward(dst)
        return _sum_rows(rows, pos)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        (dst,) = ctx.saved_tensors
        return grad.contiguous().index_select(0, dst), None, None


class _Permute(torch.autograd.Function):
    """``x[index]`` for a permutation; the backward gathers by its inverse."""

    @staticmethod
    def forward(ctx, x, index, inverse_index):  # noqa: D102
        ctx.save_for_backward(inverse_index)
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        (inverse_index,) = ctx.saved_tensors
        return grad.contiguous().index_select(0, inverse_index), None, None


def all_to_all_rows(x: torch.Tensor, group: dist.ProcessGroup, send: list[int], recv: list[int]) -> torch.Tensor:
    """``send[d]`` consecutive rows of ``x`` to group rank ``d``; the rows from each rank, in rank order."""
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    """:func:`all_to_all_rows`; the backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx, x, group, send, recv):  # noqa: D102
        ctx.route = (group, send, recv)
        return all_to_all_rows(x, group, send, recv)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        group, send, recv = ctx.route
        return all_to_all_rows(grad, group, recv, send), None, None, None


def hop(x: torch.Tensor, group: dist.ProcessGroup | None, send: list[int], recv: list[int]) -> torch.Tensor:
    """One hop's all-to-all (differentiable); nothing moves where the hop has one rank."""
    if group is None:
        return x
    if not x.requires_grad:
        return all_to_all_rows(x, group, send, recv)
    return _AllToAll.apply(x, group, send, recv)


# ------------------------------------------------------------------------------ the dispatcher


@dataclass
class NodePlan:
    """One micro-batch's indices and split sizes, from its routing map and the gathered counts."""

    splits: Splits
    copy_token: torch.Tensor  # [hop (a) send rows] token of each copy
    copy_pos: torch.Tensor  # [tokens, min(topk, nodes)] each token's copies, in node order
    slots: torch.Tensor  # [hop (a) send rows, slot width] experts within the destination node
    prob_index: torch.Tensor  # [hop (a) send rows * slot width]
    to_received: torch.Tensor  # [rows for the experts] megatron-order row -> received row
    to_expert_major: torch.Tensor  # its inverse
    tokens_per_expert: torch.Tensor  # [local experts]
    made_on: torch.cuda.Stream | None = None  # where the tensors were made (EP overlap)
    fan_copy: torch.Tensor | None = None  # hop (b): arrived copy of each expert row
    fan_pos: torch.Tensor | None = None  # hop (b): each arrived copy's expert rows

    def used_on_current_stream(self) -> None:
        """Record the tensors with the caching allocator where the current stream did not make
        them (the EP-overlap schedule's communication stream; see ``streams.py``)."""
        record_if_read_elsewhere(
            self.made_on,
            self.copy_token,
            self.copy_pos,
            self.slots,
            self.prob_index,
            self.to_received,
            self.to_expert_major,
            self.tokens_per_expert,
        )


class NodeAwareDispatcher(TorchNativeTokenDispatcher):
    """megatron's alltoall dispatcher's interface; tokens cross the inter-node link once per node."""

    def __init__(self, *args, gpus_per_node: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.groups: NodeGroups = node_groups(self.ep_group, gpus_per_node)
        layout = self.groups.layout
        if self.num_experts % layout.nodes:
            raise ValueError(f"{self.num_experts} experts do not split over {layout.nodes} nodes")
        self.experts_per_node = self.num_experts // layout.nodes
        self.slot_width = min(self.config.moe_router_topk, self.experts_per_node)
        self._plan: NodePlan | None = None

    def _gathered_counts(self, routing_map: torch.Tensor, node_hit: torch.Tensor) -> torch.Tensor:
        """``[EP, experts + nodes]`` on the host: every rank's tokens per expert and per node (the
        dispatch's one host synchronisation)."""
        counts = torch.cat([routing_map.sum(dim=0), node_hit.sum(dim=0)]).long()
        gathered = counts.new_empty(self.ep_size * counts.numel())
        dist.all_gather_into_tensor(gathered, counts, group=self.ep_group)
        return gathered.view(self.ep_size, -1).cpu()

    def _make_plan(self, routing_map: torch.Tensor, made_on: torch.cuda.Stream | None) -> NodePlan:
        layout, topk = self.groups.layout, self.config.moe_router_topk
        if not routing_map.is_cuda and bool(routing_map.sum(dim=1).gt(topk).any()):
            raise RuntimeError(f"routing map gives a token more than top-{topk} experts")
        node_hit = routing_map.view(routing_map.shape[0], layout.nodes, -1).any(dim=-1)
        splits = stage_splits(self._gathered_counts(routing_map, node_hit), layout, self.num_local_experts)
        token, node, copy_pos = node_copies(node_hit, sum(splits.send_a), min(topk, layout.nodes))
        slots, prob_index = copy_slots(routing_map, token, node, layout.nodes, self.slot_width)
        arrivals = splits.arrivals.to(routing_map.device)
        to_received = expert_order(arrivals, sum(splits.recv_b))
        return NodePlan(
            splits=splits,
            copy_token=token,
            copy_pos=copy_pos,
            slots=slots,
            prob_index=prob_index,
            to_received=to_received,
            to_expert_major=inverse(to_received),
            tokens_per_expert=arrivals.sum(dim=(0, 2)),
            made_on=made_on,
        )

    def dispatch_preprocess(self, hidden_states: torch.Tensor, routing_map: torch.Tensor, probs: torch.Tensor):
        """Plan both hops; one copy of each token per destination node, with its slots' probs."""
        tokens = self.keep_input(hidden_states, routing_map, probs)
        overlap = bool(self.config.overlap_moe_expert_parallel_comm)
        plan = self._plan = self._make_plan(routing_map, stream_of(tokens) if overlap else None)
        copies = _Replicate.apply(tokens, plan.copy_token, plan.copy_pos)
        padded = torch.cat([probs.reshape(-1), probs.new_zeros(1)])
        copy_probs = padded.index_select(0, plan.prob_index).view(-1, self.slot_width)
        return copies, copy_probs

    def token_dispatch(self, permutated_local_input_tokens, permuted_probs):
        """Hop (a) between nodes, then hop (b) from the receiving GPU to the experts' GPUs."""
        plan, groups, splits = self._plan, self.groups, self._plan.splits
        plan.used_on_current_stream()
        route_a = (groups.inter, splits.send_a, splits.recv_a)
        arrived = hop(permutated_local_input_tokens, *route_a)
        arrived_probs = hop(permuted_probs, *route_a)
        slots = hop(plan.slots, *route_a)
        plan.fan_copy, fan_slot, plan.fan_pos = fan_out(slots, self.experts_per_node, sum(splits.send_b))
        rows = _Replicate.apply(arrived, plan.fan_copy, plan.fan_pos)
        row_probs = arrived_probs.reshape(-1).index_select(0, fan_slot)
        route_b = (groups.intra, splits.send_b, splits.recv_b)
        return hop(rows, *route_b), hop(row_probs, *route_b)

    def dispatch_postprocess(self, global_input_tokens, global_probs):
        """The received rows in megatron's order (by local expert, source rank, token)."""
        plan = self._plan
        tokens = _Permute.apply(global_input_tokens, plan.to_received, plan.to_expert_major)
        probs = _Permute.apply(global_probs, plan.to_received, plan.to_expert_major)
        return tokens, plan.tokens_per_expert, probs

    def combine_preprocess(self, hidden_states):
        """Expert outputs back into the order they arrived in."""
        return _Permute.apply(hidden_states, self._plan.to_expert_major, self._plan.to_received)

    def token_combine(self, hidden_states, async_finish: bool = True, allocate_on_comm_stream: bool = True):
        """Hop (b) back, each token's rows of this node summed, then hop (a) back: one row per
        (token, node) crosses the inter-node link."""
        plan, groups, splits = self._plan, self.groups, self._plan.splits
        plan.used_on_current_stream()
        back = hop(hidden_states, groups.intra, splits.recv_b, splits.send_b)
        node_sums = _SumCopies.apply(back, plan.fan_pos, plan.fan_copy)
        return hop(node_sums, groups.inter, splits.recv_a, splits.send_a)

    def combine_postprocess(self, permutated_local_input_tokens):
        """Sum each token's node rows in node order and restore the input shape."""
        plan, self._plan = self._plan, None
        output = _SumCopies.apply(permutated_local_input_tokens, plan.copy_pos, plan.copy_token)
        return output.view(self.hidden_shape)


__all__ = [
    "NodeAwareDispatcher",
    "NodePlan",
    "Splits",
    "copy_slots",
    "expert_order",
    "fan_out",
    "node_copies",
    "stage_splits",
]
