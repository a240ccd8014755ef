"""The NVSHMEM transport of the EP row exchange: torch's ``symm_mem.all_to_all_vdev``.

Split sizes are exchanged and consumed on the GPU, so the host only enqueues kernels. The counts
all-gather goes through NVSHMEM as well (one row to every rank, buffers of its own), so a dispatcher
on this exchange issues no NCCL collective and no host wait, and its whole step can be captured in
a CUDA graph whatever the process group's backend. The buffer protocol (two send slots, one receive
buffer, one event chain) is :class:`~megatron.bridge.models.torch_native.token_exchange.RowExchange`'s.

One peer per call. In torch's kernel (``allToAllV``, torch 2.11) each thread block reads the
source offset of its peer's rows from the split buffer, while block 0, once it has issued its own
reads, overwrites those source offsets with this rank's output offsets; a block that reaches its
read after that copies the wrong rows of the peer. It happens when the GPU starts some blocks
late, which kernels of another stream make likely (how often, and what it did to a graphed
EP-overlap step: ``docs/benchmarks/implementation_costs.md``). So each call here has one
peer: in call ``k`` a rank swaps rows with rank ``rank ^ k`` only (``utils/pairwise_calls.py``: a
call's pairs then share one kind of link, NVLink or the NIC), at offset zero on both sides (the
send slot's start, and that peer's region of the receive buffer), so the value block 0 writes is
the one the late block expects. A rank's own rows never go through NVSHMEM, and one gather packs
the regions in rank order at the end. The counts all-gather stays one call: every row a rank sends
is the same, so either offset reads a right one.

Block split. torch's ``all_to_all_vdev`` divides the bytes it receives from each peer evenly over
``blocks // world`` thread blocks and asserts on the device that the division is exact; a failing
row count kills the job with a device-side assert. The block count depends on the send buffer's
size: one block per 64 KiB (torch 2.9 and later; steps at 1, 2 and 4 MiB before), rounded up to a
multiple of the group size, at most 64 within a node and 16 (or 8) across nodes.
:func:`symmetric_buffer_rows` therefore gives every NVSHMEM buffer at least
:data:`VDEV_FULL_GRID_BYTES`, where the count is the maximum for every release: then, with a power-
of-two group (required), each peer's rows are split over a power of two no larger than 64 blocks,
which divides every multiple of a 64-byte row. ``TORCH_SYMMMEM_NBLOCKS`` overrides the count
(``model.torch_native_nvshmem_blocks`` sets it); a validation rule and
:func:`symmetric_memory_support` refuse values that would not divide the rows.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from megatron.bridge.emulation.backend import EmulatedGroup
from megatron.bridge.models.torch_native.token_exchange import (
    ROW_ALIGN_BYTES,
    CollectiveExchange,
    Route,
    RowExchange,
    copy_byte_rows,
    copy_columns,
    exclusive_cumsum,
    region_pack_index,
    row_bytes,
    rows_to_pack,
    write_columns,
)
from megatron.bridge.utils.pairwise_calls import call_peer, is_power_of_two

#: Send-buffer size from which torch's ``all_to_all_vdev`` launches its largest grid (64 blocks of
#: 64 KiB within a node; 16 or 8 across nodes): 64 x 64 KiB.
VDEV_FULL_GRID_BYTES = 64 * 64 * 1024
#: The environment variable through which torch lets users fix that block count.
NVSHMEM_BLOCKS_ENV = "TORCH_SYMMMEM_NBLOCKS"


def symmetric_buffer_rows(rows: int, nbytes: int) -> int:
    """Rows to allocate for an NVSHMEM exchange buffer of ``rows`` rows of ``nbytes``: at least
    ``rows``, and enough for :data:`VDEV_FULL_GRID_BYTES`, so that torch's kernel launches its full
    grid and splits every peer's rows exactly (see the module docstring)."""
    return max(rows, math.ceil(VDEV_FULL_GRID_BYTES / nbytes))


def blocks_split_rows_exactly(blocks: int, world: int) -> bool:
    """Whether ``blocks`` thread blocks of torch's ``all_to_all_vdev`` over ``world`` ranks split
    every peer's rows exactly: its ``blocks // world`` blocks per peer must divide a 64-byte row."""
    return ROW_ALIGN_BYTES % max(blocks // world, 1) == 0


def blocks_override_problem(world: int, environ: Mapping[str, str] | None = None) -> str | None:
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


def call_rows(
    send_splits: torch.Tensor, rank: int, source_rows: int, rows: int, order: torch.Tensor | None = None
) -> torch.Tensor:
    """``[world, source_rows]``: row ``k`` holds the source rows sent in call ``k`` (to rank
    ``rank ^ k``; ``k = 0`` is this rank's own rows), ``order`` applied; past each count, some valid
    row (not sent)."""
    world = send_splits.numel()
    dests = call_peer(rank, torch.arange(world, device=send_splits.device), world)
    starts = exclusive_cumsum(send_splits)[dests]
    rows_of_call = (starts[:, None] + torch.arange(source_rows, device=send_splits.device)).clamp(max=max(rows - 1, 0))
    return order[rows_of_call] if order is not None else rows_of_call


def _symmetric_empty(shape: Sequence[int], dtype: torch.dtype, device: torch.device, group_name: str) -> torch.Tensor:
    """An NVSHMEM tensor registered with the group (the CPU tests put plain tensors here)."""
    # Deferred: torch's private symmetric-memory module is optional (builds without distributed lack it).
    import torch.distributed._symmetric_memory as symm_mem

    t = symm_mem.empty(*shape, dtype=dtype, device=device)
    symm_mem.rendezvous(t, group_name)
    return t


def _all_to_all_vdev(
    send: torch.Tensor, out: torch.Tensor, in_splits: torch.Tensor, out_splits_offsets: torch.Tensor, group_name: str
) -> None:
    """torch's NVSHMEM ``all_to_all_vdev`` (the CPU tests put an emulation of it here)."""
    torch.ops.symm_mem.all_to_all_vdev(send, out, in_splits, out_splits_offsets, group_name)


class _SymmetricBuffers:
    """One row layout's NVSHMEM buffers: two send slots, the receive buffer, and per slot the split
    buffers the peers write into (see "Buffer reuse" in ``token_exchange.py``)."""

    def __init__(
        self, send_rows: int, recv_rows: int, nbytes: int, world: int, group_name: str, device: torch.device
    ) -> None:
        def alloc(*shape: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
            return _symmetric_empty(shape, dtype, device, group_name)

        self.send_rows, self.recv_rows = symmetric_buffer_rows(send_rows, nbytes), recv_rows
        self.nbytes, self.group_name = nbytes, group_name
        ensure_symmetric_heap((2 * self.send_rows + recv_rows) * nbytes + (1 << 20))
        self.send = [alloc(self.send_rows, nbytes) for _ in range(2)]
        self.recv = alloc(recv_rows, nbytes)
        self.splits = [alloc(world, dtype=torch.int64) for _ in range(2)]
        self.splits_offsets = [alloc(2, world, dtype=torch.int64) for _ in range(2)]

    def all_to_all(self, slot: int, out: torch.Tensor) -> None:
        """``all_to_all_vdev`` of ``send[slot]`` by ``splits[slot]`` into ``out`` (``recv`` or a
        part of it: the kernel writes only this rank's memory)."""
        _all_to_all_vdev(self.send[slot], out, self.splits[slot], self.splits_offsets[slot], self.group_name)


class SymmetricMemoryExchange(RowExchange):
    """NVSHMEM ``all_to_all_vdev``: split sizes exchanged and consumed on the GPU.

    :meth:`all_gather` goes through NVSHMEM as well (one row to every rank, buffers of its own), so
    a dispatcher on this exchange issues no NCCL collective and no host wait: its whole step can be
    captured in a CUDA graph with any process-group backend.

    One peer per call (see the module docstring): in call ``k`` (1 to ``world - 1``) this rank sends
    only to rank ``rank ^ k`` and receives only from it, into that peer's region of the receive
    buffer (``route.source_rows`` rows each); its own rows are copied into its region without a
    call. One gather then packs the regions into the rows-from-rank-0-first order the readers expect.
    """

    name = "NVSHMEM symmetric-memory all_to_all_vdev, one peer per call (device-side split sizes)"
    sync_free = True

    def __init__(self, group: dist.ProcessGroup) -> None:
        super().__init__(group)
        self._group_name = group.group_name
        self.rank = dist.get_rank(group)
        self._rows: _SymmetricBuffers | None = None
        self._packed: torch.Tensor | None = None
        self._gather: _SymmetricBuffers | None = None
        self._gather_slot = 0
        self._one_hot: torch.Tensor | None = None
        # Replaced buffers stay referenced: an NVSHMEM free is collective, so it must not happen
        # whenever the garbage collector gets to it. Growth happens only when a later run in the
        # same process uses more tokens per micro-batch (or gathers a different size).
        self._retired: list[_SymmetricBuffers] = []

    def _buffers(self, send_rows: int, recv_rows: int, nbytes: int, device: torch.device) -> _SymmetricBuffers:
        # New buffers register with the live group (after a rebind, the old one may be gone).
        self._group_name = self.group.group_name
        use_nvshmem_backend(self.group)
        return _SymmetricBuffers(send_rows, recv_rows, nbytes, self.world, self._group_name, device)

    def rebind(self, group: dist.ProcessGroup) -> None:
        """Keep the buffers and the group name they were registered under: the symmetric-memory
        handles of those ranks stay valid after megatron destroys the group object, and reusing them
        needs no new collective."""
        super().rebind(group)  # buffers allocated later register with ``group``

    def _reserve_regions(self, route: Route, nbytes: int, device: torch.device) -> _SymmetricBuffers:
        """Buffers for ``route``: send slots of one peer's rows, a region per source, packed rows."""
        rows = self._rows
        self._check_row_bytes(nbytes)
        needed_recv = self.world * route.source_rows
        if rows is None or rows.send_rows < route.source_rows or rows.recv_rows < needed_recv:
            if rows is not None:
                self._retired.append(rows)
            rows = self._rows = self._buffers(route.source_rows, needed_recv, nbytes, device)
            self._row_bytes = nbytes
        if self._packed is None or self._packed.shape[0] < route.recv_rows:
            self._packed = torch.empty(route.recv_rows, nbytes, dtype=torch.uint8, device=device)
        if self._one_hot is None:
            self._one_hot = torch.eye(self.world, dtype=torch.int64, device=device)
        return rows

    def _transfer(
        self,
        sources: Sequence[torch.Tensor],
        route: Route,
        nbytes: int,
        order: torch.Tensor | None,
        count: torch.Tensor | None,
    ) -> torch.Tensor:
        bufs = self._reserve_regions(route, nbytes, sources[0].device)
        region_rows = route.source_rows
        picks = route.call_rows
        if picks is None:
            picks = call_rows(route.send_splits, self.rank, region_rows, rows_to_pack(sources, order), order)
        for k in range(self.world):
            peer = call_peer(self.rank, k, self.world)
            dest_count = route.send_splits[peer : peer + 1]
            if k == 0:  # its own rows: straight into its region
                write_columns(_region(bufs.recv, self.rank, region_rows), sources, picks[k], dest_count)
                continue
            slot = self._next_slot()
            write_columns(bufs.send[slot], sources, picks[k], dest_count)
            torch.mul(route.send_splits, self._one_hot[peer], out=bufs.splits[slot])
            bufs.all_to_all(slot, _region(bufs.recv, peer, region_rows))
        return self._pack_regions(bufs.recv, route)

    def _pack_regions(self, regions: torch.Tensor, route: Route) -> torch.Tensor:
        """Rows of the per-source regions, rank 0's first, into the packed receive buffer."""
        where = route.pack_index
        if where is None:
            where = region_pack_index(route.recv_splits, route.source_rows, route.recv_rows)
        total = route.recv_splits.sum().reshape(1)
        copy_byte_rows(regions, self._packed[: route.recv_rows], where, total)
        return self._packed

    def all_gather(self, values: torch.Tensor) -> torch.Tensor:
        """Every rank sends its ``values`` as one row to each rank, in one call: its rows are all the
        same, so torch's kernel reads a right one whichever of its offsets it uses (module docstring).
        Ordered with the row exchanges (the same event chain): NVSHMEM's team barrier inside each
        call must pair up on every rank."""
        columns = [(values.numel(), values.dtype)]
        nbytes = row_bytes(columns)
        if self._gather is None or self._gather.nbytes != nbytes:
            if self._gather is not None:
                self._retired.append(self._gather)
            self._gather = self._buffers(self.world, self.world, nbytes, values.device)
            for splits in self._gather.splits:  # one row to each rank, every time
                splits.fill_(1)
        stream_ready = self._wait_previous(values)
        slot = self._gather_slot
        self._gather_slot ^= 1
        write_columns(self._gather.send[slot], [values.view(1, -1).expand(self.world, -1)])
        self._gather.all_to_all(slot, self._gather.recv)
        (gathered,) = copy_columns(self._gather.recv[: self.world], columns)
        self._record_done(stream_ready)
        return gathered


def _region(recv: torch.Tensor, source: int, region_rows: int) -> torch.Tensor:
    return recv[source * region_rows : (source + 1) * region_rows]


# ------------------------------------------------------------------------------ availability


@dataclass(frozen=True)
class SymmetricMemorySupport:
    """Whether :class:`SymmetricMemoryExchange` can run here, and why not."""

    ok: bool
    reason: str


def symmetric_memory_support(group: dist.ProcessGroup | None, device: torch.device) -> SymmetricMemorySupport:
    """NVSHMEM present, CUDA tensors, torch's op registered, and the group spanning the whole job
    (in an emulated world, on a GPU or the CPU, only the layout's conditions).

    The last condition is conservative: NVSHMEM allocations are collective over every process of
    the job, and torch builds differ in whether their kernels translate subgroup ranks.
    """
    if _emulated(group):
        return _emulated_support(group)
    if device.type != "cuda":
        return SymmetricMemorySupport(False, "not on CUDA")
    try:
        # Deferred, as in _symmetric_empty(): a torch without it is reported here.
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError:  # pragma: no cover - torch builds without distributed
        return SymmetricMemorySupport(False, "torch has no symmetric memory")
    if not hasattr(torch.ops.symm_mem, "all_to_all_vdev"):
        return SymmetricMemorySupport(False, "torch has no symm_mem.all_to_all_vdev")
    if not symm_mem.is_nvshmem_available():
        return SymmetricMemorySupport(False, "NVSHMEM is not available")
    return _layout_support(group) or SymmetricMemorySupport(True, "NVSHMEM available")


def _layout_support(group: dist.ProcessGroup | None) -> SymmetricMemorySupport | None:
    """Why the group's layout rules the exchange out (``None``: it does not)."""
    if group is None or dist.get_world_size(group) != dist.get_world_size():
        return SymmetricMemorySupport(False, "the expert-parallel group does not span the whole job")
    world = dist.get_world_size(group)
    if not is_power_of_two(world):
        return SymmetricMemorySupport(False, f"expert-parallel size {world} is not a power of two")
    blocks_problem = blocks_override_problem(world)
    if blocks_problem is not None:
        return SymmetricMemorySupport(False, blocks_problem)
    return None


def _emulated(group: dist.ProcessGroup | None) -> bool:
    return isinstance(group, EmulatedGroup)


def _emulated_support(group: dist.ProcessGroup) -> SymmetricMemorySupport:
    """In an emulated world the layout's own conditions decide (a cluster of the target GPUs has
    NVSHMEM); the exchange is played by ``emulated_exchange.py`` (on a CPU, from host split sizes)."""
    return _layout_support(group) or SymmetricMemorySupport(
        True, "NVSHMEM EMULATED: split sizes and modeled time stay on the device"
    )


_BACKEND_SET = False


def use_nvshmem_backend(group: dist.ProcessGroup) -> None:
    """Select NVSHMEM for symmetric-memory allocations (once per process, before the first one) and
    register ``group`` with symmetric memory."""
    global _BACKEND_SET
    # Deferred, as in _symmetric_empty().
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
    """The NVSHMEM exchange where requested (the caller checked :func:`symmetric_memory_support`);
    over an emulated group, its stand-in."""
    if prefer_symmetric and _emulated(group):
        # Deferred: the stand-in builds on this module's index functions.
        from megatron.bridge.models.torch_native.emulated_exchange import EmulatedSymmetricExchange

        return EmulatedSymmetricExchange(group)
    if prefer_symmetric:
        use_nvshmem_backend(group)
        return SymmetricMemoryExchange(group)
    return CollectiveExchange(group)


__all__: list[str] = [
    "NVSHMEM_BLOCKS_ENV",
    "SymmetricMemoryExchange",
    "SymmetricMemorySupport",
    "VDEV_FULL_GRID_BYTES",
    "blocks_override_problem",
    "blocks_split_rows_exactly",
    "call_rows",
    "ensure_symmetric_heap",
    "make_exchange",
    "region_pack_index",
    "symmetric_buffer_rows",
    "symmetric_memory_support",
    "use_nvshmem_backend",
]
