"""The sorted dispatcher's exchange between EP ranks: the plan, the index function, the autograd
exchanges and the buffers they share.

Each micro-batch's plan (:class:`ExchangePlan`) is computed on the device from every rank's
per-expert counts, all-gathered over the EP group: how many rows go to and come from each rank, and
the permutations between the order rows arrive in (source-rank-major) and megatron's order (by local
expert, then source rank). The routing indices and the plan are one function, replayed from a CUDA
graph on GPUs (:data:`graphed_routing_and_plan`). :class:`DispatchExchange` and
:class:`CombineExchange` move the rows through a :class:`RowExchange` (NVSHMEM symmetric memory or
``all_to_all_single``), one per set of EP ranks and transport (:func:`shared_exchange`). The
dispatcher that uses them is ``ExpertParallelSortedDispatcher`` (``sorted_dispatcher.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from megatron.bridge.models.torch_native.compiled import LazyCompiled
from megatron.bridge.models.torch_native.index_graph import GraphedIndexFunction
from megatron.bridge.models.torch_native.sorted_permutation import permutation_indices
from megatron.bridge.models.torch_native.streams import record_if_read_elsewhere
from megatron.bridge.models.torch_native.symmetric_exchange import call_rows, make_exchange
from megatron.bridge.models.torch_native.token_exchange import (
    Route,
    RowExchange,
    copy_columns,
    exclusive_cumsum,
    region_pack_index,
)


@dataclass
class ExchangePlan:
    """Everything about one micro-batch's exchange, computed on the device from the gathered counts.

    Received rows arrive source-rank-major (all rows from rank 0, then rank 1, ...; within a
    source, by local expert). ``to_source_major[i]`` is the received row that becomes row ``i`` in
    expert-major order (megatron's order: by local expert, then by source rank); ``to_expert_major``
    is its inverse on the received rows. Without a budget (``expert_rows == capacity``) both are
    permutations of ``range(capacity)`` and padding rows map to themselves. With one
    (``expert_rows < capacity``: ``model.torch_native_rank_capacity_factor``, see ``expert_rows.py``)
    the experts' tensors hold ``expert_rows`` rows, ``to_source_major`` has that many entries and
    ``to_expert_major`` always names a row below it. Where this rank receives more than
    ``expert_rows``, the experts hold the first ``expert_rows`` in expert-major order
    (``held_total``, ``tokens_per_expert`` cut to match) and the rest read and return some held row's
    values: finite, never out of bounds, and ``peak_rows`` stops the step before it is applied.
    """

    send_splits: torch.Tensor  # [ep] rows this rank sends to each rank
    recv_splits: torch.Tensor  # [ep] rows this rank receives from each rank
    tokens_per_expert: torch.Tensor  # [local experts] rows the experts hold (sum: held_total)
    recv_total: torch.Tensor  # [1] rows received (the rest of the capacity is padding)
    held_total: torch.Tensor  # [1] rows the experts hold: recv_total, at most expert_rows
    to_source_major: torch.Tensor  # [expert_rows]
    to_expert_major: torch.Tensor  # [capacity]
    peak_rows: torch.Tensor  # [1] the most rows any rank receives in this micro-batch
    send_rows: int
    capacity: int
    expert_rows: int
    # the stream that computed the tensors, where other streams read them (EP overlap); None otherwise
    made_on: torch.cuda.Stream | None = None
    # the NVSHMEM exchange's per-call rows and region pack indices, both ways (see :func:`call_tensors`)
    calls: tuple[torch.Tensor, ...] | None = None
    # (send, recv) splits on the host, copied once when a transport first needs them
    _host: tuple[list[int], list[int]] | None = field(default=None, repr=False)

    def to_experts(self) -> Route:
        """The dispatch (and the combine's backward): token rows to the experts' ranks."""
        rows, pack = self.calls[:2] if self.calls is not None else (None, None)
        return Route(
            self.send_splits, self.recv_splits, self.capacity, self._source_rows, rows, pack, on_host=self.host_splits
        )

    def to_tokens(self) -> Route:
        """The combine (and the dispatch's backward): expert rows back to their tokens' ranks."""
        rows, pack = self.calls[2:] if self.calls is not None else (None, None)
        return Route(
            self.recv_splits,
            self.send_splits,
            self.send_rows,
            self._source_rows,
            rows,
            pack,
            on_host=lambda: self.host_splits()[::-1],
        )

    def host_splits(self) -> tuple[list[int], list[int]]:
        """``(send_splits, recv_splits)`` on the host: one device-to-host copy for the plan's four
        exchanges (dispatch, combine and their backwards), made when the first one needs it."""
        if self._host is None:
            send, recv = torch.stack([self.send_splits, self.recv_splits]).tolist()
            self._host = (send, recv)
        return self._host

    @property
    def _source_rows(self) -> int:
        return rows_from_one_rank(self.capacity, self.send_splits.numel())

    def used_on_current_stream(self) -> None:
        """Record the plan's tensors with the caching allocator where the current stream is not the
        one that made them (the EP-overlap schedule's communication stream; see ``streams.py``).
        Called by the exchanges' forwards: their backwards run on the same stream, and one record
        per stream covers every read queued there before the memory is freed."""
        record_if_read_elsewhere(
            self.made_on,
            self.send_splits,
            self.recv_splits,
            self.tokens_per_expert,
            self.recv_total,
            self.held_total,
            self.to_source_major,
            self.to_expert_major,
            self.peak_rows,
            *(self.calls or ()),
        )


def _plan_tensors(all_counts: torch.Tensor, rank: int, num_local_experts: int, capacity: int, expert_rows: int):
    """The device tensors of :class:`ExchangePlan`, in its field order (one small fused computation
    on GPUs)."""
    ep = all_counts.shape[0]
    peak = all_counts.view(ep, ep, num_local_experts).sum(dim=(0, 2)).max().reshape(1)  # [src, dest, expert]
    mine = all_counts[:, rank * num_local_experts : (rank + 1) * num_local_experts]  # [src, local expert]
    source_starts = exclusive_cumsum(mine.reshape(-1)).view(ep, num_local_experts)
    expert_major = mine.t().reshape(-1)  # segment (expert e, source s) at e * ep + s
    segment_ends = torch.cumsum(expert_major, 0)
    segment_starts = segment_ends - expert_major
    row = torch.arange(expert_rows, device=all_counts.device)
    segment = torch.searchsorted(segment_ends, row, right=True)
    valid = segment < expert_major.numel()
    segment = segment.clamp(max=expert_major.numel() - 1)
    expert, source = segment // ep, segment % ep
    source_row = source_starts[source, expert] + (row - segment_starts[segment])
    to_source_major = torch.where(valid, source_row, row)
    # rows the experts do not hold (past the budget, or padding past expert_rows) name a held row:
    # their own index, capped at the last one
    beyond = torch.arange(capacity, device=all_counts.device).clamp(max=expert_rows - 1)
    to_expert_major = beyond.scatter(0, to_source_major, row)
    recv_total = mine.sum().reshape(1)
    per_expert = mine.sum(0)
    ends = torch.cumsum(per_expert, 0)  # no new constant tensor: inductor folds one eagerly, which a capture refuses
    tokens_per_expert = ends.clamp(max=expert_rows) - (ends - per_expert).clamp(max=expert_rows)
    send_splits = all_counts[rank].view(ep, num_local_experts).sum(1)
    held_total = recv_total.clamp(max=expert_rows)
    return send_splits, mine.sum(1), tokens_per_expert, recv_total, held_total, to_source_major, to_expert_major, peak


# static shapes: one graph per (EP size, experts, capacity, expert rows), i.e. per run
_COMPILED_PLAN = LazyCompiled(_plan_tensors, "EP exchange plan", dynamic=False)


PLAN_TENSORS = 8
"""How many of :func:`plan_tensors`' outputs are :class:`ExchangePlan` fields (any after them are
:func:`call_tensors`')."""


def plan_tensors(
    all_counts: torch.Tensor, rank: int, num_local_experts: int, capacity: int, expert_rows: int
) -> tuple[torch.Tensor, ...]:
    """:func:`_plan_tensors`, compiled on GPUs."""
    args = (all_counts, rank, num_local_experts, capacity, expert_rows)
    return _COMPILED_PLAN(_plan_tensors, *args) if all_counts.is_cuda else _plan_tensors(*args)


def rows_from_one_rank(capacity: int, ep_size: int) -> int:
    """The most rows one rank sends another, either way: its tokens x min(top-k, local experts)
    (``capacity`` is ``ep_size`` times that)."""
    return capacity // ep_size


def call_tensors(plan: tuple[torch.Tensor, ...], rank: int, capacity: int, send_rows: int) -> tuple[torch.Tensor, ...]:
    """The NVSHMEM exchange's indices for both routes of :func:`plan_tensors`' plan: the rows sent in
    each call and the region pack index, to the experts then back to the tokens (see
    ``symmetric_exchange.call_rows``; computed here, inside the graphed index function, they cost
    the host no launches of their own)."""
    send_splits, recv_splits, *_, to_expert_major, _ = plan
    source_rows = rows_from_one_rank(capacity, send_splits.numel())
    return (
        call_rows(send_splits, rank, source_rows, send_rows),
        region_pack_index(recv_splits, source_rows, capacity),
        call_rows(recv_splits, rank, source_rows, capacity, order=to_expert_major),
        region_pack_index(send_splits, source_rows, send_rows),
    )


def make_plan(
    tensors: tuple[torch.Tensor, ...],
    capacity: int,
    send_rows: int,
    made_on: torch.cuda.Stream | None = None,
) -> ExchangePlan:
    """An :class:`ExchangePlan` from :func:`plan_tensors`' tensors, in their order, then optionally
    :func:`call_tensors`'; ``made_on``: the stream that computed them, where other streams will read
    them (the EP-overlap schedule)."""
    fields = tensors[:PLAN_TENSORS]
    return ExchangePlan(
        *fields,
        send_rows=send_rows,
        capacity=capacity,
        expert_rows=fields[5].numel(),
        made_on=made_on,
        calls=tuple(tensors[PLAN_TENSORS:]) or None,
    )


def exchange_plan(
    all_counts: torch.Tensor,
    rank: int,
    num_local_experts: int,
    capacity: int,
    send_rows: int,
    expert_rows: int | None = None,
) -> ExchangePlan:
    """``all_counts[s, e]``: tokens rank ``s`` routes to global expert ``e`` -> this rank's plan
    (``expert_rows`` ``None``: the experts hold the whole capacity)."""
    held = capacity if expert_rows is None else expert_rows
    return make_plan(plan_tensors(all_counts, rank, num_local_experts, capacity, held), capacity, send_rows)


def routing_and_plan(
    routing_map: torch.Tensor,
    all_counts: torch.Tensor,
    *,
    topk: int,
    rank: int,
    num_local_experts: int,
    capacity: int,
    expert_rows: int,
    with_calls: bool = False,
) -> tuple[torch.Tensor, ...]:
    """:func:`permutation_indices`, then :func:`plan_tensors` (and, ``with_calls``, the NVSHMEM
    exchange's :func:`call_tensors`): everything the EP dispatcher computes before it moves a token,
    as one function (one graph on GPUs)."""
    plan = plan_tensors(all_counts, rank, num_local_experts, capacity, expert_rows)
    calls = call_tensors(plan, rank, capacity, routing_map.shape[0] * topk) if with_calls else ()
    return (*permutation_indices(routing_map, topk), *plan, *calls)


graphed_routing_and_plan = GraphedIndexFunction(routing_and_plan, "EP routing indices and exchange plan")


class DispatchExchange(torch.autograd.Function):
    """Tokens and probs to the experts' ranks, received straight into expert-major order.

    Rows arrive source-major; reading them out of the receive buffer gathers them by
    ``plan.to_source_major``, so the re-sort costs no extra pass, and stops at the received total
    (padding rows are not copied). The backward packs the gradient rows back into source-major
    order as it copies them into the send buffer, again only the received total.
    """

    @staticmethod
    def forward(ctx, tokens, probs, plan: ExchangePlan, exchange: RowExchange, nbytes: int):  # noqa: D102
        hidden = tokens.shape[1]
        ctx.plan, ctx.exchange, ctx.nbytes = plan, exchange, nbytes
        ctx.send_rows, ctx.dtypes = tokens.shape[0], (tokens.dtype, probs.dtype)
        plan.used_on_current_stream()
        return exchange.exchange(
            [tokens, probs.reshape(-1, 1)],
            plan.to_experts(),
            _tokens_and_probs_reader(hidden, tokens.dtype, probs.dtype, plan.to_source_major, plan.held_total),
            nbytes,
        )

    @staticmethod
    def backward(ctx, grad_tokens, grad_probs):  # noqa: D102
        plan, (token_dtype, probs_dtype) = ctx.plan, ctx.dtypes
        if grad_probs is None:
            grad_probs = torch.zeros(plan.expert_rows, dtype=probs_dtype, device=grad_tokens.device)
        grad_x, grad_p = ctx.exchange.exchange(
            [grad_tokens, grad_probs.reshape(-1, 1)],
            plan.to_tokens(),
            _tokens_and_probs_reader(grad_tokens.shape[1], token_dtype, probs_dtype),
            ctx.nbytes,
            order=plan.to_expert_major,
            count=plan.recv_total,
        )
        return grad_x, grad_p, None, None, None


def _tokens_and_probs_reader(
    hidden: int,
    token_dtype: torch.dtype,
    probs_dtype: torch.dtype,
    order: torch.Tensor | None = None,
    count: torch.Tensor | None = None,
):
    """Copies the token and prob columns (their rows ``order``, the first ``count`` of them, where
    given) out of a received byte buffer, both in one kernel launch."""

    def read(recv: torch.Tensor):
        tokens, probs = copy_columns(recv, [(hidden, token_dtype), (1, probs_dtype)], order, count)
        return tokens, probs.reshape(-1)

    return read


class CombineExchange(torch.autograd.Function):
    """Expert outputs (expert-major ``[capacity, hidden]``) back to their tokens' ranks.

    The rows are packed source-major as they are copied into the send buffer (the received total of
    them: the padding rows are not sent); the backward reads the returning gradients straight into
    expert-major order.
    """

    @staticmethod
    def forward(ctx, expert_out, plan: ExchangePlan, exchange: RowExchange, nbytes: int):  # noqa: D102
        ctx.plan, ctx.exchange, ctx.nbytes = plan, exchange, nbytes
        plan.used_on_current_stream()
        return exchange.exchange(
            [expert_out],
            plan.to_tokens(),
            _column_reader(expert_out),
            nbytes,
            order=plan.to_expert_major,
            count=plan.recv_total,
        )

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        plan = ctx.plan
        read = _column_reader(grad, plan.to_source_major, plan.held_total)
        return ctx.exchange.exchange([grad], plan.to_experts(), read, ctx.nbytes), None, None, None


def _column_reader(like: torch.Tensor, order: torch.Tensor | None = None, count: torch.Tensor | None = None):
    """Reads a ``like``-shaped (width and dtype) first column (its rows ``order``, the first ``count``
    of them, where given) out of a received byte buffer."""
    return lambda recv: copy_columns(recv, [(like.shape[1], like.dtype)], order, count)[0]


_EXCHANGES: dict[tuple[tuple[int, ...], str], RowExchange] = {}  # (EP ranks, transport) -> exchange


def shared_exchange(group: dist.ProcessGroup, transport: str, device: torch.device) -> RowExchange:
    """One exchange (and one set of buffers) per set of EP ranks and transport, shared by all layers.

    Keyed by the ranks, not the group object: a process that trains several models one after
    another (benchmarks) gets new groups of the same ranks each time and keeps its buffers.
    """
    key = (tuple(dist.get_process_group_ranks(group)), transport)
    exchange = _EXCHANGES.get(key)
    if exchange is None:
        exchange = _EXCHANGES[key] = make_exchange(group, device, prefer_symmetric=transport == "nvshmem")
    elif exchange.group is not group:
        exchange.rebind(group)
    return exchange
