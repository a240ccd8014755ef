"""The NVSHMEM exchange's host-side logic, on CPU: buffer sizes that torch's ``all_to_all_vdev``
splits exactly, block-count overrides that it would not, the counts all-gather through the
exchange's own buffers, the one-peer-per-call exchange against torch's offset race (emulated over
gloo), and the allocator records for tensors read on another stream."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from megatron.bridge.models.torch_native import sorted_permutation, streams
from megatron.bridge.models.torch_native.sorted_exchange import exchange_plan
from megatron.bridge.models.torch_native.symmetric_exchange import (
    VDEV_FULL_GRID_BYTES,
    SymmetricMemoryExchange,
    blocks_override_problem,
    symmetric_buffer_rows,
)
from megatron.bridge.models.torch_native.token_exchange import ROW_ALIGN_BYTES, CollectiveExchange, row_bytes

KIB, MIB = 1024, 1024 * 1024


def _blocks_since_2_9(send_bytes: int, world: int, within_node: bool) -> int:
    """torch >= 2.9: one block per 64 KiB of the send buffer, rounded up to a multiple of the group
    size, at most 64 within a node and 16 across nodes."""
    blocks = math.ceil(send_bytes / (64 * KIB))
    blocks = math.ceil(blocks / world) * world
    return min(blocks, 64 if within_node else 16)


def _blocks_before_2_9(send_bytes: int, world: int, within_node: bool) -> int:
    """Earlier releases: 8, 16, 32 or 64 blocks by size (steps at 1, 2 and 4 MiB), at most 16 past
    eight ranks and 8 past sixteen."""
    blocks = 8 if send_bytes < MIB else 16 if send_bytes < 2 * MIB else 32 if send_bytes < 4 * MIB else 64
    if world > 8:
        blocks = min(blocks, 16 if world <= 16 else 8)
    return blocks


GRIDS = [_blocks_since_2_9, _blocks_before_2_9]


def _splits_exactly(grid, rows: int, nbytes: int, world: int, within_node: bool) -> bool:
    """Whether every received row count divides over the kernel's blocks per peer (it asserts on the
    device otherwise)."""
    per_peer = max(grid(rows * nbytes, world, within_node) // world, 1)
    return all((count * nbytes) % per_peer == 0 for count in range(rows + 1))


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("world", [2, 4, 8, 16, 32])
@pytest.mark.parametrize("nbytes", [ROW_ALIGN_BYTES, 576, 4160, 6208])
@pytest.mark.parametrize("rows", [1, 7, 1536, 65536])
@pytest.mark.parametrize("within_node", [True, False])
def test_symmetric_buffers_split_every_row_count_exactly(grid, world, nbytes, rows, within_node) -> None:
    allocated = symmetric_buffer_rows(rows, nbytes)
    assert allocated >= rows and allocated * nbytes >= VDEV_FULL_GRID_BYTES
    assert _splits_exactly(grid, allocated, nbytes, world, within_node)


def test_a_smaller_buffer_would_hit_the_device_assert() -> None:
    """The small check model at EP=2: 1,536 rows of 576 bytes give torch 2.11 fourteen blocks, seven
    per peer, and one received row does not divide by seven (the assert seen on an H200)."""
    assert not _splits_exactly(_blocks_since_2_9, 1536, 576, 2, True)
    assert _splits_exactly(_blocks_since_2_9, symmetric_buffer_rows(1536, 576), 576, 2, True)


@pytest.mark.parametrize(
    "value,world,problem",
    [
        (None, 2, False),
        ("", 2, False),
        ("0", 2, False),  # unset, or ignored by torch
        ("64", 2, False),
        ("16", 8, False),
        ("8", 8, False),
        ("4", 8, False),  # powers of two per peer
        ("6", 2, True),
        ("24", 8, True),
        ("48", 4, True),  # 3 blocks per peer: 64-byte rows do not split
        ("many", 2, True),
    ],
)
def test_a_block_override_that_would_not_split_rows_is_named(value, world, problem) -> None:
    environ = {} if value is None else {"TORCH_SYMMMEM_NBLOCKS": value}
    reason = blocks_override_problem(world, environ)
    assert (reason is not None) is problem
    if problem:
        assert "TORCH_SYMMMEM_NBLOCKS" in reason


class _LoopbackBuffers:
    """Stands in for the NVSHMEM buffers of a two-rank group on CPU: row 0 of a received buffer is
    this rank's sent row, row 1 the peer's (``peer_row``)."""

    def __init__(self, rows: int, nbytes: int, peer_row: torch.Tensor) -> None:
        self.rows, self.nbytes, self.peer_row = rows, nbytes, peer_row
        self.send = [torch.zeros(rows, nbytes, dtype=torch.uint8) for _ in range(2)]
        self.recv = torch.zeros(rows, nbytes, dtype=torch.uint8)
        self.splits = [torch.zeros(2, dtype=torch.int64) for _ in range(2)]
        self.slots_run: list = []

    def all_to_all(self, slot: int, out: torch.Tensor) -> None:
        assert self.splits[slot].tolist() == [1, 1] and out is self.recv  # one row to each rank, in one call
        self.slots_run.append(slot)
        out[0] = self.send[slot][0]
        out[1, : self.peer_row.numel()] = self.peer_row


def test_symmetric_all_gather_sends_one_row_to_every_rank_through_its_own_buffers(gloo_world, monkeypatch) -> None:
    counts, peer_counts = torch.tensor([3, 0, 5, 1]), torch.tensor([2, 2, 0, 7])
    peer_row = torch.zeros(row_bytes([(4, torch.int64)]), dtype=torch.uint8)
    peer_row[:32] = peer_counts.view(torch.uint8)
    made = []

    def buffers(self, send_rows, recv_rows, nbytes, device):
        made.append(_LoopbackBuffers(recv_rows, nbytes, peer_row))
        return made[-1]

    monkeypatch.setattr(SymmetricMemoryExchange, "_buffers", buffers)
    exchange = SymmetricMemoryExchange(dist.group.WORLD)
    exchange.world = 2
    for _ in range(3):
        assert torch.equal(exchange.all_gather(counts), torch.stack([counts, peer_counts]))
    assert len(made) == 1 and made[0].slots_run == [0, 1, 0]  # slots alternate, buffers are kept
    exchange.all_gather(torch.tensor([1.0, 2.0] * 20))  # another row size: new buffers, old ones retired
    assert len(made) == 2 and exchange._retired == [made[0]]


CHILDREN = Path(__file__).parent / "children"


@pytest.mark.parametrize("world", [2, 4])
def test_the_exchange_is_exact_even_where_every_vdev_block_reads_overwritten_offsets(
    run_child_script, tmp_path, world
) -> None:
    """torch's kernel lets a late thread block read a peer's rows at the output offset that block 0
    has written over the source offset. The emulation gives every block that fate: one call with
    rows for every rank then delivers wrong rows, while the exchange (one peer per call, where the
    two offsets are both zero) matches all_to_all_single bit for bit, in ``world - 1`` calls."""
    reports = run_child_script(CHILDREN / "symmetric_exchange_rounds.py", tmp_path, world_size=world, timeout=300)
    assert not all(r["one_call_late_right"] for r in reports) and all(r["one_call_on_time_right"] for r in reports)
    for report in reports:
        assert [e["equal"] for e in report["exchanges"]] == [True] * 5
        assert {e["calls"] for e in report["exchanges"]} == {world - 1}
    assert any(e["rows"] for r in reports for e in r["exchanges"])


def test_collective_all_gather_stacks_every_rank(gloo_world) -> None:
    counts = torch.tensor([4, 0, 9])
    assert torch.equal(CollectiveExchange(dist.group.WORLD).all_gather(counts), counts.view(1, -1))


class _Stream(SimpleNamespace):
    """A CUDA stream stand-in (streams compare by identity here)."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, device=None)


@pytest.fixture
def recorded(monkeypatch):
    """``record_stream`` calls, as (tensor, stream), with the current stream set by the test."""
    calls, current = [], [None]
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[0])
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, stream: calls.append((t, stream)))
    return SimpleNamespace(calls=calls, current=current)


@pytest.mark.parametrize("elsewhere", [False, True])
def test_the_exchange_plan_is_recorded_only_where_another_stream_reads_it(recorded, elsewhere) -> None:
    compute, comm = _Stream("compute"), _Stream("comm")
    plan = exchange_plan(torch.tensor([[1, 0, 2, 3], [0, 4, 1, 1]]), 0, 2, capacity=8, send_rows=6)
    plan.made_on = compute
    recorded.current[0] = comm if elsewhere else compute
    plan.used_on_current_stream()
    expected = (
        [
            plan.send_splits,
            plan.recv_splits,
            plan.tokens_per_expert,
            plan.recv_total,
            plan.held_total,
            plan.to_source_major,
            plan.to_expert_major,
            plan.peak_rows,
        ]
        if elsewhere
        else []
    )
    assert [t for t, _ in recorded.calls] == expected and all(s is comm for _, s in recorded.calls)


def test_nothing_is_recorded_for_tensors_made_off_cuda(recorded) -> None:
    recorded.current[0] = _Stream("comm")
    streams.record_if_read_elsewhere(None, torch.zeros(3))
    assert recorded.calls == []


def test_the_unpermutation_records_its_indices_where_it_runs_on_another_stream(recorded) -> None:
    """Under EP overlap the combine (and with it the unpermutation) runs on the communication stream:
    the forward reads ``pos``, the backward ``src_token``, both made on the compute stream; both are
    recorded there, once (the backward runs on the forward's stream)."""
    compute, comm = _Stream("compute"), _Stream("comm")
    routing_map = torch.tensor([[1, 1, 0], [0, 1, 1], [1, 0, 1], [1, 1, 0]], dtype=torch.bool)
    src_token, pos, _ = sorted_permutation.permutation_indices(routing_map, topk=2)
    y = torch.randn(src_token.numel(), 4, requires_grad=True)
    recorded.current[0] = comm
    out = sorted_permutation.unpermute_sorted(y, (src_token, pos, compute))
    out.sum().backward()
    assert [t for t, _ in recorded.calls] == [pos, src_token] and all(s is comm for _, s in recorded.calls)
