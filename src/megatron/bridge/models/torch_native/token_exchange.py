"""All-to-all of token rows between expert-parallel ranks, with split sizes that stay on the device.

megatron-core's alltoall dispatcher hands ``torch.distributed.all_to_all_single`` split sizes that
must be host integers, so every MoE layer copies the routing counts to the host and waits for the
GPU to reach the router before it can launch the exchange. The host then never runs ahead of the
GPU, and megatron's combined-1F1B schedule has nothing queued to overlap the exchange with.

A :class:`RowExchange` moves rows into buffers of a static size instead. The split sizes go in as a
device tensor, the receiver learns its counts on the device, and the caller reads the received rows
with a device-side index. Two transports implement it:

* ``SymmetricMemoryExchange`` (``symmetric_exchange.py``): torch's NVSHMEM-backed
  ``symm_mem.all_to_all_vdev``; the host only enqueues kernels (no synchronisation).
* :class:`CollectiveExchange`: ``all_to_all_single`` with the split sizes copied to the host. It is
  not sync-free; it runs the same buffer layout over any process group (gloo on CPU), so the
  dispatcher built on top is tested everywhere.

Rows of several tensors travel side by side in one row of bytes (for the dispatch: the token's
hidden state and its routing probability), padded to :data:`ROW_ALIGN_BYTES`.

Buffer reuse (for the NVSHMEM exchange). It *reads* its input from the peers (``getmem``), so a rank
may not overwrite its send buffer while a slower peer still copies from it. Every NVSHMEM call
starts with a barrier inside its split-exchange kernel, which a peer reaches only after finishing
its previous call; the send buffers (and the split buffers the peers write into) therefore
alternate between two slots, call after call, and call ``n+2`` reuses call ``n``'s slot safely. The
receive buffer is written by this rank's own kernels and read right after them on the same
stream, so one suffices. All
exchanges of a rank run in host issue order, also across CUDA streams (each waits on the event of
the previous one); every rank issues them in the same order, as collectives require.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from megatron.bridge.models.torch_native.row_gather import gather_row_pairs

ROW_ALIGN_BYTES = 64
T = TypeVar("T")


def row_bytes(columns: Sequence[tuple[int, torch.dtype]]) -> int:
    """Bytes of one packed row holding ``columns`` (``(width, dtype)`` each), padded to 64 bytes."""
    raw = sum(width * dtype.itemsize for width, dtype in columns)
    return max(ROW_ALIGN_BYTES, math.ceil(raw / ROW_ALIGN_BYTES) * ROW_ALIGN_BYTES)


def column(buffer: torch.Tensor, start_byte: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """``[rows, width]`` view of ``dtype`` elements at byte ``start_byte`` of each packed row."""
    return buffer[:, start_byte : start_byte + width * dtype.itemsize].view(dtype)


_WORDS = (torch.int64, torch.int32, torch.int16)


def _word_views(*byte_columns: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``[rows, nbytes]`` uint8 views as the widest words (8, 4 or 2 bytes) that all of them allow:
    a copy then moves that many bytes per element instead of one."""
    for word in _WORDS:
        size = word.itemsize
        if all(
            b.shape[1] % size == 0 and b.storage_offset() % size == 0 and b.stride(0) % size == 0 for b in byte_columns
        ):
            return tuple(b.view(word) for b in byte_columns)
    return byte_columns


def _byte_columns(columns: Sequence[tuple[int, torch.dtype]]) -> list[tuple[int, int]]:
    """``(start byte, byte width)`` of each column, side by side from byte 0."""
    spans, start = [], 0
    for width, dtype in columns:
        spans.append((start, width * dtype.itemsize))
        start += width * dtype.itemsize
    return spans


def copy_columns(
    buffer: torch.Tensor,
    columns: Sequence[tuple[int, torch.dtype]],
    order: torch.Tensor | None = None,
    count: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Contiguous copies of the packed ``columns`` (``(width, dtype)`` each, side by side from byte
    0); with ``order``, of their rows ``order`` (the gather is the copy: one pass over memory instead
    of two); with ``count`` as well, only the first ``count`` rows are copied (the rest of each
    result is unspecified padding). Two columns are copied per kernel launch."""
    rows = buffer.shape[0] if order is None else order.numel()
    results, pairs = [], []
    for (width, dtype), (start, nbytes) in zip(columns, _byte_columns(columns)):
        out = torch.empty(rows, width, dtype=dtype, device=buffer.device)
        pairs.append(_word_views(buffer[:, start : start + nbytes], out.view(torch.uint8)))
        results.append(out)
    gather_row_pairs(pairs, order, count)
    return results


def copy_byte_rows(
    src: torch.Tensor,
    out: torch.Tensor,
    index: torch.Tensor | None = None,
    count: torch.Tensor | None = None,
) -> None:
    """``out[i] = src[index[i]]`` for ``i < count`` over ``[rows, nbytes]`` byte buffers, moved as the
    widest words both allow."""
    gather_row_pairs([_word_views(src, out)], index, count)


def rows_to_pack(sources: Sequence[torch.Tensor], order: torch.Tensor | None = None) -> int:
    """How many rows packing ``sources`` makes: all of theirs, or one per entry of ``order``."""
    return sources[0].shape[0] if order is None else order.numel()


def write_columns(
    buffer: torch.Tensor,
    sources: Sequence[torch.Tensor],
    order: torch.Tensor | None = None,
    count: torch.Tensor | None = None,
) -> None:
    """Copy the 2-D ``sources`` (their rows ``order``, where given, gathered as they are copied; only
    the first ``count`` of those, where given) side by side into the packed rows from byte 0. Two
    columns are copied per kernel launch."""
    rows = rows_to_pack(sources, order)
    spans = _byte_columns([(src.shape[1], src.dtype) for src in sources])
    pairs = [
        _word_views(src.contiguous().view(torch.uint8), buffer[:rows, start : start + nbytes])
        for src, (start, nbytes) in zip(sources, spans)
    ]
    gather_row_pairs(pairs, order, count)


def exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    """``[0, x0, x0+x1, ...]`` without the total (offsets of consecutive blocks)."""
    return torch.cumsum(x, dim=0) - x


def region_pack_index(recv_splits: torch.Tensor, source_rows: int, recv_rows: int) -> torch.Tensor:
    """``[recv_rows]``: for each received row in rank order (rank 0's rows first), its row in the
    per-source regions (``source_rows`` rows each); past the received total, some valid row."""
    world = recv_splits.numel()
    ends = torch.cumsum(recv_splits, 0)
    row = torch.arange(recv_rows, device=recv_splits.device)
    source = torch.searchsorted(ends, row, right=True).clamp_(max=world - 1)
    where = source * source_rows + row - (ends[source] - recv_splits[source])
    return where.clamp_(max=world * source_rows - 1)


@dataclass(frozen=True)
class Route:
    """Which rows of one exchange go where, on the device, with the host-side bounds of the buffers.

    ``send_splits[d]``: rows this rank sends to rank ``d`` (consecutive packed rows, in rank order);
    ``recv_splits[s]``: rows it receives from rank ``s``; ``recv_rows``: the most it can receive in
    all (the receive buffer's rows); ``source_rows``: the most any one rank can send it.
    ``call_rows`` and ``pack_index``: the NVSHMEM exchange's per-call indices, precomputed where a
    caller can do it more cheaply (the EP dispatcher does, inside its graphed index function);
    computed by the exchange when absent (``symmetric_exchange.call_rows`` and
    :func:`region_pack_index` say what they hold). ``on_host``: where given, returns
    ``(send_splits, recv_splits)`` as host lists, copied from the device once for all the routes of
    one plan (a transport that needs host split sizes then waits for the GPU once per micro-batch
    and layer, not once per exchange).
    """

    send_splits: torch.Tensor
    recv_splits: torch.Tensor
    recv_rows: int
    source_rows: int
    call_rows: torch.Tensor | None = None
    pack_index: torch.Tensor | None = None
    on_host: Callable[[], tuple[list[int], list[int]]] | None = None

    def host_splits(self) -> tuple[list[int], list[int]]:
        """``(send_splits, recv_splits)`` as host lists (a device synchronisation unless cached)."""
        if self.on_host is not None:
            return self.on_host()
        return self.send_splits.tolist(), self.recv_splits.tolist()


class RowExchange:
    """All-to-all of packed rows over ``group`` into static-size buffers.

    ``exchange(sources, route, read)`` packs the 2-D ``sources`` (same row count, any dtypes) side
    by side into send rows, sends ``route.send_splits[d]`` consecutive rows to rank ``d`` (in rank
    order), and calls ``read(recv)`` on the received ``[route.recv_rows, row_bytes]`` byte buffer:
    rows from rank 0 first, then rank 1, ... Rows past the received total hold stale data. ``read``
    must copy what it keeps: the buffer is reused by the next exchange. With ``order``, send row
    ``i`` is row ``order[i]`` of each source (a reordering fused into the packing copy); with
    ``count`` (a device tensor, at least ``sum(send_splits)``) as well, rows from ``count`` on are
    not packed, since they are not sent.
    """

    #: Whether the host enqueues the exchange without waiting for the GPU.
    sync_free: bool = False
    #: Name shown in the start-up line and ``summary.json``.
    name: str = ""

    def __init__(self, group: dist.ProcessGroup | None, world: int | None = None) -> None:
        """``world``: the group's size, read from ``group`` unless given (an exchange that sends
        nothing, as the local-cost benchmark's, has no group)."""
        self.group = group
        self.world = dist.get_world_size(group) if world is None else world
        self._capacity_rows = 0
        self._row_bytes = 0
        self._slot = 0
        # the previous exchange's end: (event, its stream, whether recorded inside a CUDA-graph capture)
        self._last_done: tuple[torch.cuda.Event, torch.cuda.Stream, bool] | None = None

    def rebind(self, group: dist.ProcessGroup) -> None:
        """Use a new group of the same ranks (the old one was destroyed), keeping the buffers."""
        self.group = group

    # ---------------------------------------------------------------- subclass hooks

    def _allocate(self, rows: int, nbytes: int, device: torch.device) -> int:
        """Allocate buffers for at least ``rows`` rows of ``nbytes``; returns the rows they hold."""
        raise NotImplementedError

    def _send_buffer(self, slot: int) -> torch.Tensor:
        raise NotImplementedError

    def _run(self, slot: int, route: Route) -> torch.Tensor:
        """Exchange the packed rows of ``slot``; returns the receive buffer."""
        raise NotImplementedError

    def _transfer(
        self,
        sources: Sequence[torch.Tensor],
        route: Route,
        nbytes: int,
        order: torch.Tensor | None,
        count: torch.Tensor | None,
    ) -> torch.Tensor:
        """Pack and send; returns the receive buffer (rows from rank 0 first). Here: every row into
        one send slot, then one collective (:meth:`_run`)."""
        self._reserve(max(rows_to_pack(sources, order), route.recv_rows), nbytes, sources[0].device)
        slot = self._next_slot()
        write_columns(self._send_buffer(slot), sources, order, count)
        return self._run(slot, route)

    def all_gather(self, values: torch.Tensor) -> torch.Tensor:
        """``[world, n]``: the 1-D ``values`` of every rank (same ``n`` and dtype everywhere), in
        rank order, by this exchange's transport."""
        raise NotImplementedError

    # ---------------------------------------------------------------- public

    def exchange(
        self,
        sources: Sequence[torch.Tensor],
        route: Route,
        read: Callable[[torch.Tensor], T],
        nbytes: int | None = None,
        order: torch.Tensor | None = None,
        count: torch.Tensor | None = None,
    ) -> T:
        """Send rows of ``sources`` (in ``order``, where given) along ``route``; ``read(received rows)``."""
        source_rows = sources[0].shape[0]
        if any(s.dim() != 2 or s.shape[0] != source_rows for s in sources):
            raise ValueError("sources must be 2-D tensors with the same number of rows")
        if nbytes is None:
            nbytes = row_bytes([(s.shape[1], s.dtype) for s in sources])
        stream_ready = self._wait_previous(sources[0])
        recv = self._transfer(sources, route, nbytes, order, count)
        result = read(recv[: route.recv_rows])
        self._record_done(stream_ready)
        return result

    # ---------------------------------------------------------------- internals

    def _next_slot(self) -> int:
        """The send slot of the next transfer; the two slots alternate (see "Buffer reuse")."""
        slot, self._slot = self._slot, self._slot ^ 1
        return slot

    def _check_row_bytes(self, nbytes: int) -> None:
        """The buffers keep the row size of the first exchange: a different one is a caller's error."""
        if nbytes != self._row_bytes and self._row_bytes:
            raise ValueError(f"row size changed from {self._row_bytes} to {nbytes} bytes; use one layout per exchange")

    def _reserve(self, rows: int, nbytes: int, device: torch.device) -> None:
        self._check_row_bytes(nbytes)
        if rows <= self._capacity_rows:
            return
        self._capacity_rows, self._row_bytes = self._allocate(rows, nbytes, device), nbytes

    def _wait_previous(self, like: torch.Tensor) -> tuple[torch.cuda.Stream, bool] | None:
        """Order this exchange after the previous one when that ran on another stream (on the same
        stream, stream order does it); returns the current stream and whether it is capturing
        (``None`` off CUDA).

        Only an event of the same kind is waited on: CUDA refuses a wait inside a capture on an event
        recorded outside it, and a wait outside on an event recorded inside one. Skipping those waits
        is safe: megatron's wrapper synchronises the device before it captures, and the training
        loop before every step, so an exchange of the other kind has finished.
        """
        if not like.is_cuda:
            return None
        stream = torch.cuda.current_stream(like.device)  # with the device: no device lookup on the host
        capturing = torch.cuda.is_current_stream_capturing()
        last = self._last_done
        if last is not None and last[1] != stream and last[2] == capturing:
            stream.wait_event(last[0])
        return stream, capturing

    def _record_done(self, stream_state: tuple[torch.cuda.Stream, bool] | None) -> None:
        if stream_state is not None:
            stream, capturing = stream_state
            self._last_done = (stream.record_event(), stream, capturing)


class CollectiveExchange(RowExchange):
    """``all_to_all_single`` on plain buffers; split sizes go through the host (not sync-free)."""

    name = "all_to_all_single with host split sizes"

    def _allocate(self, rows: int, nbytes: int, device: torch.device) -> int:
        self._send = [torch.empty(rows, nbytes, dtype=torch.uint8, device=device) for _ in range(2)]
        self._recv = torch.empty(rows, nbytes, dtype=torch.uint8, device=device)
        return rows

    def _send_buffer(self, slot: int) -> torch.Tensor:
        return self._send[slot]

    def _run(self, slot: int, route: Route) -> torch.Tensor:
        send_list, recv_list = route.host_splits()
        dist.all_to_all_single(
            self._recv[: sum(recv_list)], self._send[slot][: sum(send_list)], recv_list, send_list, group=self.group
        )
        return self._recv

    def all_gather(self, values: torch.Tensor) -> torch.Tensor:
        out = torch.empty(self.world * values.numel(), dtype=values.dtype, device=values.device)
        dist.all_gather_into_tensor(out, values, group=self.group)
        return out.view(self.world, -1)


__all__: list[str] = [
    "CollectiveExchange",
    "ROW_ALIGN_BYTES",
    "Route",
    "RowExchange",
    "column",
    "copy_byte_rows",
    "copy_columns",
    "exclusive_cumsum",
    "region_pack_index",
    "row_bytes",
    "rows_to_pack",
    "write_columns",
]
