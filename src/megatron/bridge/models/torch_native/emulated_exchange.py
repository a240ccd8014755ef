"""The sorted dispatcher's NVSHMEM transport in an emulated world: nothing about it reaches the host.

On a cluster, :class:`~megatron.bridge.models.torch_native.symmetric_exchange.SymmetricMemoryExchange`
moves rows with NVSHMEM kernels that read the split sizes on the GPU, so the host enqueues a whole
step without waiting for it. An emulated world (``megatron.bridge.emulation``) has no peer to map
memory with; :class:`EmulatedSymmetricExchange` plays that transport the way the emulated backend
plays NCCL, and keeps its one property that matters for overlap, that the host never reads a split
size:

* **received rows**: from each peer, the rows its receive split says, taken from the rows this rank
  sends itself (in a symmetric world a peer's rows for this rank are shaped like those), cycled
  where a peer sends more (:func:`stand_in_rows`). One index computation and one gather from the
  sources, on the device;
* **time**: one kernel (``emulation.hold``) reads the send splits, prices one call per peer in turn
  (latency plus bytes over that peer's link, as the real transport's one-peer-per-call exchange
  runs), holds the network's communication SMs for that time on the current stream, and adds the
  call to a device-side tally that the training loop reads once a step;
* **the counts all-gather** replicates this rank's counts (every rank routes alike in a symmetric
  world) and is charged as one call to every peer, whose size the host knows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from megatron.bridge.models.torch_native.compiled import LazyCompiled
from megatron.bridge.models.torch_native.token_exchange import (
    Route,
    RowExchange,
    region_pack_index,
    row_bytes,
    rows_to_pack,
    write_columns,
)


def _stand_in_rows(
    send_splits: torch.Tensor,
    where: torch.Tensor,
    rank: int,
    source_rows: int,
    send_rows: int,
    order: torch.Tensor | None,
) -> torch.Tensor:
    own = send_splits[rank]
    start = send_splits[:rank].sum()
    mine = own > 0
    span = torch.where(mine, own, send_splits.sum()).clamp(min=1)
    rows = (torch.where(mine, start, 0) + (where % source_rows) % span).clamp(max=max(send_rows - 1, 0))
    return rows if order is None else order[rows]


# static shapes: one graph per route of a run
_COMPILED_STAND_IN = LazyCompiled(_stand_in_rows, "emulated exchange stand-in rows", dynamic=False)


def stand_in_rows(route: Route, rank: int, send_rows: int, order: torch.Tensor | None) -> torch.Tensor:
    """``[route.recv_rows]``: for each received row (rank 0's first), the send row (``order``
    applied) that stands in for it: row ``o`` of any peer's block is this rank's own row ``o``,
    cycled when the peer sends more (in a symmetric world it sends as many); a rank that sends
    itself nothing cycles over all its send rows. Never a padding row: those hold no values."""
    where = route.pack_index
    if where is None:
        where = region_pack_index(route.recv_splits, route.source_rows, route.recv_rows)
    args = (route.send_splits, where, rank, route.source_rows, send_rows, order)
    return _COMPILED_STAND_IN(_stand_in_rows, *args) if where.is_cuda else _stand_in_rows(*args)


class EmulatedSymmetricExchange(RowExchange):
    """The NVSHMEM exchange's stand-in over an emulated group (see the module docstring)."""

    name = "NVSHMEM all_to_all_vdev, EMULATED (split sizes and modeled time on the GPU, one peer per call)"
    sync_free = True

    def __init__(self, group: dist.ProcessGroup) -> None:
        super().__init__(group)
        self.rank = dist.get_rank(group)

    def _allocate(self, rows: int, nbytes: int, device: torch.device) -> int:
        self._recv = torch.empty(rows, nbytes, dtype=torch.uint8, device=device)
        return rows

    def _transfer(
        self,
        sources: Sequence[torch.Tensor],
        route: Route,
        nbytes: int,
        order: torch.Tensor | None,
        count: torch.Tensor | None,
    ) -> torch.Tensor:
        self._reserve(route.recv_rows, nbytes, sources[0].device)
        index = stand_in_rows(route, self.rank, rows_to_pack(sources, order), order)
        write_columns(self._recv, sources, index, route.recv_splits.sum().reshape(1))
        self.group.world.charge_serial_exchange(self.group, route.send_splits, nbytes)
        return self._recv

    def all_gather(self, values: torch.Tensor) -> torch.Tensor:
        stream_ready = self._wait_previous(values)
        gathered = values.reshape(1, -1).repeat(self.world, 1)
        nbytes = row_bytes([(values.numel(), values.dtype)])
        self.group.world.charge_rows(self.group, "all_gather", [nbytes] * self.world, values.is_cuda)
        self._record_done(stream_ready)
        return gathered


__all__ = ["EmulatedSymmetricExchange", "stand_in_rows"]
