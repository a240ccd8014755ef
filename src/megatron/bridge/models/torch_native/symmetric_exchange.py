"""The NVSHMEM transport of the EP row exchange: torch's ``symm_mem.all_to_all_vdev``.

Split sizes are exchanged and consumed on the GPU, so the host only enqueues kernels. The counts
all-gather goes through NVSHMEM as well (one row to every rank, buffers of its own), so a dispatcher
on this exchange issues no NCCL collective and no host wait, and its whole step can be captured in
a CUDA graph whatever the process group's backend. The buffer protocol (two send slots, one receive
buffer, one event chain) is :class:`~megatron.bridge.models.torch_native.token_exchange.RowExchange`'s.

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
from dataclasses import dataclass
from typing import List, Mapping, Optional

import torch
import torch.distributed as dist

from megatron.bridge.models.torch_native.token_exchange import (
    ROW_ALIGN_BYTES,
    CollectiveExchange,
    RowExchange,
    copy_columns,
    row_bytes,
    write_columns,
)

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
    "NVSHMEM_BLOCKS_ENV",
    "SymmetricMemoryExchange",
    "SymmetricMemorySupport",
    "VDEV_FULL_GRID_BYTES",
    "blocks_override_problem",
    "blocks_split_rows_exactly",
    "ensure_symmetric_heap",
    "make_exchange",
    "symmetric_buffer_rows",
    "symmetric_memory_support",
    "use_nvshmem_backend",
]
