"""All-to-all of token rows between expert-parallel ranks, with split sizes that stay on the device.

megatron-core's alltoall dispatcher hands ``torch.distributed.all_to_all_single`` split sizes that
must be host integers, so every MoE layer copies the routing counts to the host and waits for the
GPU to reach the router before it can launch the exchange. The host then never runs ahead of the
GPU, and megatron's combined-1F1B schedule has nothing queued to overlap the exchange with.

A :class:`RowExchange` moves rows into buffers of a static size instead. The split sizes go in as a
device tensor, the receiver learns its counts on the device, and the caller reads the received rows
with a device-side index. Two transports implement it:

* :class:`SymmetricMemoryExchange`: torch's NVSHMEM-backed ``symm_mem.all_to_all_vdev``; the host
  only enqueues kernels (no synchronisation).
* :class:`CollectiveExchange`: ``all_to_all_single`` with the split sizes copied to the host. It is
  not sync-free; it runs the same buffer layout over any process group (gloo on CPU), so the
  dispatcher built on top is tested everywhere.

Rows of several tensors travel side by side in one row of bytes (for the dispatch: the token's
hidden state and its routing probability), padded to :data:`ROW_ALIGN_BYTES`.

Block split of the NVSHMEM kernel. torch's ``all_to_all_vdev`` divides the bytes it receives from
each peer evenly over ``blocks // world`` thread blocks and asserts on the device that the division
is exact; a failing row count kills the job with a device-side assert. The block count depends on
the send buffer's size: one block per 64 KiB (torch 2.9 and later; steps at 1, 2 and 4 MiB before),
rounded up to a multiple of the group size, at most 64 within a node and 16 (or 8) across nodes.
:func:`symmetric_buffer_rows` therefore gives every NVSHMEM buffer at least
:data:`VDEV_FULL_GRID_BYTES`, where the count is the maximum for every release: then, with a
power-of-two group (required), each peer's rows are split over a power of two no larger than 64
blocks, which divides every multiple of a 64-byte row. ``TORCH_SYMMMEM_NBLOCKS`` overrides the
count (``model.torch_native_nvshmem_blocks`` sets it); a validation rule and
:func:`symmetric_memory_support` refuse values that would not divide the rows.

Buffer reuse. The NVSHMEM exchange *reads* its input from the peers (``getmem``), so a rank may not
overwrite its send buffer while a slower peer still copies from it. The exchange of step ``n+1``
starts with a barrier inside its split-exchange kernel, which a peer reaches only after finishing
step ``n``; the send buffers (and the split buffers the peers write into) therefore alternate
between two slots, and step ``n+2`` reuses step ``n``'s slot safely. The receive buffer is written
by this rank's own kernel and read right after it on the same stream, so one suffices. All
exchanges of a rank run in host issue order, also across CUDA streams (each waits on the event of
the previous one); every rank issues them in the same order, as collectives require.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from typing import Callable, List, Mapping, Optional, Sequence, Tuple, TypeVar

import torch
import torch.distributed as dist

from megatron.bridge.models.torch_native.dispatch_policy import NVSHMEM_BLOCKS_ENV
from megatron.bridge.models.torch_native.row_gather import gather_row_pairs

ROW_ALIGN_BYTES = 64
#: Send-buffer size from which torch's ``all_to_all_vdev`` launches its largest grid (64 blocks of
#: 64 KiB within a node; 16 or 8 across nodes): 64 x 64 KiB.
VDEV_FULL_GRID_BYTES = 64 * 64 * 1024
T = TypeVar("T")


def row_bytes(columns: Sequence[Tuple[int, torch.dtype]]) -> int:
    """Bytes of one packed row holding ``columns`` (``(width, dtype)`` each), padded to 64 bytes."""
    raw = sum(width * dtype.itemsize for width, dtype in columns)
    return max(ROW_ALIGN_BYTES, math.ceil(raw / ROW_ALIGN_BYTES) * ROW_ALIGN_BYTES)


def symmetric_buffer_rows(rows: int, nbytes: int) -> int:
    """Rows to allocate for an NVSHMEM exchange buffer of ``rows`` rows of ``nbytes``: at least
    ``rows``, and enough for :data:`VDEV_FULL_GRID_BYTES`, so that torch's kernel launches its full
    grid and splits every peer's rows exactly (see the module docstring)."""
    return max(rows, math.ceil(VDEV_FULL_GRID_BYTES / nbytes))


def blocks_split_rows_exactly(blocks: int, world: int) -> bool:
    """Whether ``blocks`` thread blocks of torch's ``all_to_all_vdev`` over ``world`` ranks split
    every peer's rows exactly: its ``blocks // world`` blocks per peer must divide a 64-byte row."""
    return ROW_ALIGN_BYTES % max(blocks // world, 1) == 0


def blocks_override_problem(world: int, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Why the ``TORCH_SYMMMEM_NBLOCKS`` in the environment would make torch's kernel assert for
    some row count; ``None`` if it is unset or fine. (``model.torch_native_nvshmem_blocks`` is
    checked by a validation rule before it is written there.)"""
    raw = (os.environ if environ is None else environ).get(NVSHMEM_BLOCKS_ENV, "").strip()
    if not raw:
        return None
    try:
        blocks = int(raw)
    except ValueError:
        return f"{NVSHMEM_BLOCKS_ENV}={raw!r} is not an integer"
    if blocks <= 0 or blocks_split_rows_exactly(blocks, world):
        return None  # torch ignores values below 1
    return (
        f"{NVSHMEM_BLOCKS_ENV}={blocks} splits each peer's rows over {blocks // world} thread blocks, "
        f"which does not divide {ROW_ALIGN_BYTES}-byte rows (torch's all_to_all_vdev would stop the "
        f"job with a device-side assert); unset it or use {world} times a power of two"
    )


def column(buffer: torch.Tensor, start_byte: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """``[rows, width]`` view of ``dtype`` elements at byte ``start_byte`` of each packed row."""
    return buffer[:, start_byte:start_byte + width * dtype.itemsize].view(dtype)


_WORDS = (torch.int64, torch.int32, torch.int16)


def _word_views(*byte_columns: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """``[rows, nbytes]`` uint8 views as the widest words (8, 4 or 2 bytes) that all of them allow:
    a copy then moves that many bytes per element instead of one."""
    for word in _WORDS:
        size = word.itemsize
        if all(b.shape[1] % size == 0 and b.storage_offset() % size == 0 and b.stride(0) % size == 0
               for b in byte_columns):
            return tuple(b.view(word) for b in byte_columns)
    return byte_columns


def _byte_columns(columns: Sequence[Tuple[int, torch.dtype]]) -> List[Tuple[int, int]]:
    """``(start byte, byte width)`` of each column, side by side from byte 0."""
    spans, start = [], 0
    for width, dtype in columns:
        spans.append((start, width * dtype.itemsize))
        start += width * dtype.itemsize
    return spans


def copy_columns(
    buffer: torch.Tensor, columns: Sequence[Tuple[int, torch.dtype]],
    order: Optional[torch.Tensor] = None, count: Optional[torch.Tensor] = None,
) -> List[torch.Tensor]:
    """Contiguous copies of the packed ``columns`` (``(width, dtype)`` each, side by side from byte
    0); with ``order``, of their rows ``order`` (the gather is the copy: one pass over memory instead
    of two); with ``count`` as well, only the first ``count`` rows are copied (the rest of each
    result is unspecified padding). Two columns are copied per kernel launch."""
    rows = buffer.shape[0] if order is None else order.numel()
    results, pairs = [], []
    for (width, dtype), (start, nbytes) in zip(columns, _byte_columns(columns)):
        out = torch.empty(rows, width, dtype=dtype, device=buffer.device)
        pairs.append(_word_views(buffer[:, start:start + nbytes], out.view(torch.uint8)))
        results.append(out)
    gather_row_pairs(pairs, order, count)
    return results


def write_columns(
    buffer: torch.Tensor, sources: Sequence[torch.Tensor],
    order: Optional[torch.Tensor] = None, count: Optional[torch.Tensor] = None,
) -> None:
    """Copy the 2-D ``sources`` (their rows ``order``, where given, gathered as they are copied; only
    the first ``count`` of those, where given) side by side into the packed rows from byte 0. Two
    columns are copied per kernel launch."""
    rows = sources[0].shape[0] if order is None else order.numel()
    spans = _byte_columns([(src.shape[1], src.dtype) for src in sources])
    pairs = [
        _word_views(src.contiguous().view(torch.uint8), buffer[:rows, start:start + nbytes])
        for src, (start, nbytes) in zip(sources, spans)
    ]
    gather_row_pairs(pairs, order, count)


def exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    """``[0, x0, x0+x1, ...]`` without the total (offsets of consecutive blocks)."""
    return torch.cumsum(x, dim=0) - x


class RowExchange:
    """All-to-all of packed rows over ``group`` into static-size buffers.

    ``exchange(sources, send_splits, recv_rows, read)`` packs the 2-D ``sources`` (same row count,
    any dtypes) side by side into the send buffer, sends ``send_splits[d]`` consecutive rows to rank
    ``d`` (in rank order), and calls ``read(recv)`` on the received ``[recv_rows, row_bytes]`` byte
    buffer: rows from rank 0 first, then rank 1, ... Rows past the received total hold stale data.
    ``read`` must copy what it keeps: the buffer is reused by the next exchange. With ``order``, send
    row ``i`` is row ``order[i]`` of each source (a reordering fused into the packing copy); with
    ``count`` (a device tensor, at least ``sum(send_splits)``) as well, rows from ``count`` on are
    not packed, since they are not sent.
    """

    #: Whether the host enqueues the exchange without waiting for the GPU.
    sync_free: bool = False
    #: Name shown in the start-up line and ``summary.json``.
    name: str = ""

    def __init__(self, group: Optional[dist.ProcessGroup], world: Optional[int] = None) -> None:
        """``world``: the group's size, read from ``group`` unless given (an exchange that sends
        nothing, as the local-cost benchmark's, has no group)."""
        self.group = group
        self.world = dist.get_world_size(group) if world is None else world
        self._capacity_rows = 0
        self._row_bytes = 0
        self._slot = 0
        # the previous exchange's end: (event, its stream, whether recorded inside a CUDA-graph capture)
        self._last_done: Optional[Tuple[torch.cuda.Event, torch.cuda.Stream, bool]] = None

    def rebind(self, group: dist.ProcessGroup) -> None:
        """Use a new group of the same ranks (the old one was destroyed), keeping the buffers."""
        self.group = group

    # ---------------------------------------------------------------- subclass hooks

    def _allocate(self, rows: int, nbytes: int, device: torch.device) -> int:
        """Allocate buffers for at least ``rows`` rows of ``nbytes``; returns the rows they hold."""
        raise NotImplementedError

    def _send_buffer(self, slot: int) -> torch.Tensor:
        raise NotImplementedError

    def _run(self, slot: int, send_splits: torch.Tensor) -> torch.Tensor:
        """Exchange the packed rows of ``slot``; returns the receive buffer."""
        raise NotImplementedError

    def all_gather(self, values: torch.Tensor) -> torch.Tensor:
        """``[world, n]``: the 1-D ``values`` of every rank (same ``n`` and dtype everywhere), in
        rank order, by this exchange's transport."""
        raise NotImplementedError

    # ---------------------------------------------------------------- public

    def exchange(
        self,
        sources: Sequence[torch.Tensor],
        send_splits: torch.Tensor,
        recv_rows: int,
        read: Callable[[torch.Tensor], T],
        nbytes: Optional[int] = None,
        order: Optional[torch.Tensor] = None,
        count: Optional[torch.Tensor] = None,
    ) -> T:
        """Send rows of ``sources`` (in ``order``, where given) by ``send_splits``; ``read(received rows)``."""
        source_rows = sources[0].shape[0]
        if any(s.dim() != 2 or s.shape[0] != source_rows for s in sources):
            raise ValueError("sources must be 2-D tensors with the same number of rows")
        rows = source_rows if order is None else order.numel()
        if nbytes is None:
            nbytes = row_bytes([(s.shape[1], s.dtype) for s in sources])
        self._reserve(max(rows, recv_rows), nbytes, sources[0].device)
        stream_ready = self._wait_previous(sources[0])
        slot = self._slot
        self._slot ^= 1
        write_columns(self._send_buffer(slot), sources, order, count)
        recv = self._run(slot, send_splits)
        result = read(recv[:recv_rows])
        self._record_done(stream_ready)
        return result

    # ---------------------------------------------------------------- internals

    def _reserve(self, rows: int, nbytes: int, device: torch.device) -> None:
        if nbytes != self._row_bytes and self._row_bytes:
            raise ValueError(f"row size changed from {self._row_bytes} to {nbytes} bytes; use one layout per exchange")
        if rows <= self._capacity_rows:
            return
        self._capacity_rows, self._row_bytes = self._allocate(rows, nbytes, device), nbytes

    def _wait_previous(self, like: torch.Tensor) -> Optional[Tuple[torch.cuda.Stream, bool]]:
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

    def _record_done(self, stream_state: Optional[Tuple[torch.cuda.Stream, bool]]) -> None:
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

    def _run(self, slot: int, send_splits: torch.Tensor) -> torch.Tensor:
        recv_splits = torch.empty_like(send_splits)
        dist.all_to_all_single(recv_splits, send_splits.contiguous(), group=self.group)
        send_list, recv_list = send_splits.tolist(), recv_splits.tolist()
        dist.all_to_all_single(
            self._recv[:sum(recv_list)], self._send[slot][:sum(send_list)], recv_list, send_list, group=self.group
        )
        return self._recv

    def all_gather(self, values: torch.Tensor) -> torch.Tensor:
        out = torch.empty(self.world * values.numel(), dtype=values.dtype, device=values.device)
        dist.all_gather_into_tensor(out, values, group=self.group)
        return out.view(self.world, -1)


class _SymmetricBuffers:
    """One row layout's NVSHMEM buffers: two send slots, the receive buffer, and per slot the split
    buffers the peers write into (see "Buffer reuse" in the module docstring)."""

    def __init__(self, rows: int, nbytes: int, world: int, group_name: str, device: torch.device) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        def alloc(*shape: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
            t = symm_mem.empty(*shape, dtype=dtype, device=device)
            symm_mem.rendezvous(t, group_name)
            return t

        self.rows, self.nbytes, self.group_name = symmetric_buffer_rows(rows, nbytes), nbytes, group_name
        ensure_symmetric_heap(3 * self.rows * nbytes + (1 << 20))
        self.send = [alloc(self.rows, nbytes) for _ in range(2)]
        self.recv = alloc(self.rows, nbytes)
        self.splits = [alloc(world, dtype=torch.int64) for _ in range(2)]
        self.splits_offsets = [alloc(2, world, dtype=torch.int64) for _ in range(2)]

    def run(self, slot: int, send_splits: Optional[torch.Tensor]) -> torch.Tensor:
        """``all_to_all_vdev`` of ``send[slot]``; ``send_splits`` ``None``: the split buffer already
        holds them."""
        if send_splits is not None:
            self.splits[slot].copy_(send_splits)
        torch.ops.symm_mem.all_to_all_vdev(
            self.send[slot], self.recv, self.splits[slot], self.splits_offsets[slot], self.group_name
        )
        return self.recv


class SymmetricMemoryExchange(RowExchange):
    """NVSHMEM ``all_to_all_vdev``: split sizes exchanged and consumed on the GPU.

    :meth:`all_gather` goes through NVSHMEM as well (one row to every rank, buffers of its own), so
    a dispatcher on this exchange issues no NCCL collective and no host wait: its whole step can be
    captured in a CUDA graph with any process-group backend.
    """

    name = "NVSHMEM symmetric-memory all_to_all_vdev (device-side split sizes)"
    sync_free = True

    def __init__(self, group: dist.ProcessGroup) -> None:
        super().__init__(group)
        self._group_name = group.group_name
        self._rows: Optional[_SymmetricBuffers] = None
        self._gather: Optional[_SymmetricBuffers] = None
        self._gather_slot = 0
        # Replaced buffers stay referenced: an NVSHMEM free is collective, so it must not happen
        # whenever the garbage collector gets to it. Growth happens only when a later run in the
        # same process uses more tokens per micro-batch (or gathers a different size).
        self._retired: List[_SymmetricBuffers] = []

    def _buffers(self, rows: int, nbytes: int, device: torch.device) -> _SymmetricBuffers:
        # New buffers register with the live group (after a rebind, the old one may be gone).
        self._group_name = self.group.group_name
        use_nvshmem_backend(self.group)
        return _SymmetricBuffers(rows, nbytes, self.world, self._group_name, device)

    def _allocate(self, rows: int, nbytes: int, device: torch.device) -> int:
        if self._rows is not None:
            self._retired.append(self._rows)
        self._rows = self._buffers(rows, nbytes, device)
        return self._rows.rows

    def rebind(self, group: dist.ProcessGroup) -> None:
        """Keep the buffers and the group name they were registered under: the symmetric-memory
        handles of those ranks stay valid after megatron destroys the group object, and reusing them
        needs no new collective."""
        super().rebind(group)  # buffers allocated later register with ``group``

    def _send_buffer(self, slot: int) -> torch.Tensor:
        return self._rows.send[slot]

    def _run(self, slot: int, send_splits: torch.Tensor) -> torch.Tensor:
        return self._rows.run(slot, send_splits)

    def all_gather(self, values: torch.Tensor) -> torch.Tensor:
        """Every rank sends its ``values`` as one row to each rank. Ordered with the row exchanges
        (the same event chain): NVSHMEM's team barrier inside each exchange must pair up on every
        rank."""
        columns = [(values.numel(), values.dtype)]
        nbytes = row_bytes(columns)
        if self._gather is None or self._gather.nbytes != nbytes:
            if self._gather is not None:
                self._retired.append(self._gather)
            self._gather = self._buffers(self.world, nbytes, values.device)
            for splits in self._gather.splits:  # one row to each rank, every time
                splits.fill_(1)
        stream_ready = self._wait_previous(values)
        slot = self._gather_slot
        self._gather_slot ^= 1
        write_columns(self._gather.send[slot], [values.view(1, -1).expand(self.world, -1)])
        recv = self._gather.run(slot, None)
        (gathered,) = copy_columns(recv[:self.world], columns)
        self._record_done(stream_ready)
        return gathered


# ------------------------------------------------------------------------------ availability


@dataclass(frozen=True)
class SymmetricMemorySupport:
    """Whether :class:`SymmetricMemoryExchange` can run here, and why not."""

    ok: bool
    reason: str


def symmetric_memory_support(group: Optional[dist.ProcessGroup], device: torch.device) -> SymmetricMemorySupport:
    """NVSHMEM present, CUDA tensors, torch's op registered, and the group spanning the whole job.

    The last condition is conservative: NVSHMEM allocations are collective over every process of
    the job, and torch builds differ in whether their kernels translate subgroup ranks.
    """
    if device.type != "cuda":
        return SymmetricMemorySupport(False, "not on CUDA")
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError:  # pragma: no cover - torch builds without distributed
        return SymmetricMemorySupport(False, "torch has no symmetric memory")
    if not hasattr(torch.ops.symm_mem, "all_to_all_vdev"):
        return SymmetricMemorySupport(False, "torch has no symm_mem.all_to_all_vdev")
    if not symm_mem.is_nvshmem_available():
        return SymmetricMemorySupport(False, "NVSHMEM is not available")
    if group is None or dist.get_world_size(group) != dist.get_world_size():
        return SymmetricMemorySupport(False, "the expert-parallel group does not span the whole job")
    world = dist.get_world_size(group)
    if world & (world - 1):
        return SymmetricMemorySupport(False, f"expert-parallel size {world} is not a power of two")
    blocks_problem = blocks_override_problem(world)
    if blocks_problem is not None:
        return SymmetricMemorySupport(False, blocks_problem)
    return SymmetricMemorySupport(True, "NVSHMEM available")


_BACKEND_SET = False


def use_nvshmem_backend(group: dist.ProcessGroup) -> None:
    """Select NVSHMEM for symmetric-memory allocations (once per process, before the first one) and
    register ``group`` with symmetric memory."""
    global _BACKEND_SET
    import torch.distributed._symmetric_memory as symm_mem

    if not _BACKEND_SET:
        if symm_mem.get_backend(torch.device("cuda")) != "NVSHMEM":
            symm_mem.set_backend("NVSHMEM")
        _BACKEND_SET = True
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None:  # required by older torch releases, a deprecated no-op in newer ones
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            enable(group.group_name)


def ensure_symmetric_heap(nbytes: int) -> None:
    """Size NVSHMEM's symmetric heap for ``nbytes`` (with headroom) unless the user chose a size.

    NVSHMEM reads ``NVSHMEM_SYMMETRIC_SIZE`` once, when torch initialises it at the first
    symmetric allocation; later calls cannot grow it.
    """
    if "NVSHMEM_SYMMETRIC_SIZE" not in os.environ:
        os.environ["NVSHMEM_SYMMETRIC_SIZE"] = str(max(2 * nbytes, 2 << 30))


def make_exchange(group: dist.ProcessGroup, device: torch.device, prefer_symmetric: bool) -> RowExchange:
    """The NVSHMEM exchange where requested (the caller checked :func:`symmetric_memory_support`)."""
    if prefer_symmetric:
        use_nvshmem_backend(group)
        return SymmetricMemoryExchange(group)
    return CollectiveExchange(group)




__all__: List[str] = [
    "CollectiveExchange",
    "ROW_ALIGN_BYTES",
    "RowExchange",
    "SymmetricMemoryExchange",
    "SymmetricMemorySupport",
    "blocks_override_problem",
    "blocks_split_rows_exactly",
    "VDEV_FULL_GRID_BYTES",
    "column",
    "copy_columns",
    "exclusive_cumsum",
    "make_exchange",
    "row_bytes",
    "symmetric_buffer_rows",
    "symmetric_memory_support",
    "write_columns",
]
