"""torch's NVSHMEM ``all_to_all_vdev`` emulated over a gloo group on CPU, for the exchange's tests.

``late_blocks=True`` gives every received row the fate a late thread block gives it in torch's
kernel: read from the peer's send buffer at this rank's *output* offset for that peer (block 0 has
overwritten the source offsets with them) instead of at the source offset. A transfer is right in
that mode only if the two offsets agree for every peer that sends rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from megatron.bridge.models.torch_native import symmetric_exchange


class EmulatedVdev:
    """Callable with ``all_to_all_vdev``'s arguments; counts its calls."""

    def __init__(self, late_blocks: bool = True) -> None:
        self.late_blocks, self.calls = late_blocks, 0

    def __call__(
        self,
        send: torch.Tensor,
        out: torch.Tensor,
        in_splits: torch.Tensor,
        out_splits_offsets: torch.Tensor,
        group_name: str,
    ) -> None:
        self.calls += 1
        world, me = dist.get_world_size(), dist.get_rank()
        sends = [torch.empty_like(send) for _ in range(world)]
        splits = [torch.empty_like(in_splits) for _ in range(world)]
        dist.all_gather(sends, send.contiguous())
        dist.all_gather(splits, in_splits.contiguous())
        out_splits = torch.stack([splits[q][me] for q in range(world)])
        out_offsets = torch.cumsum(out_splits, 0) - out_splits
        for q in range(world):
            rows, at = int(out_splits[q]), int(out_offsets[q])
            source = at if self.late_blocks else int(splits[q][:me].sum())
            taken = sends[q][source : source + rows]  # past the end of the buffer: other memory, zeros here
            out[at : at + taken.shape[0]] = taken
            out[at + taken.shape[0] : at + rows] = 0
        out_splits_offsets[0].copy_(out_splits)
        out_splits_offsets[1].copy_(out_offsets)


def install(monkeypatch_setattr, late_blocks: bool = True) -> EmulatedVdev:
    """Route ``symmetric_exchange``'s NVSHMEM calls to plain CPU tensors and the emulation.
    ``monkeypatch_setattr``: ``setattr`` or pytest's ``monkeypatch.setattr``."""
    vdev = EmulatedVdev(late_blocks)

    def empty(shape: Sequence[int], dtype: torch.dtype, device: torch.device, group_name: str) -> torch.Tensor:
        return torch.zeros(*shape, dtype=dtype, device=device)

    monkeypatch_setattr(symmetric_exchange, "_symmetric_empty", empty)
    monkeypatch_setattr(symmetric_exchange, "_all_to_all_vdev", vdev)
    monkeypatch_setattr(symmetric_exchange, "use_nvshmem_backend", lambda group: None)
    return vdev
