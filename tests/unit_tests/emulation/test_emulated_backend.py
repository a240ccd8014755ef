"""The emulated backend's collectives: what a symmetric world returns, and what each is charged."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from megatron.bridge.emulation.backend import EmulationUnsupported, start_world, stop_world
from megatron.bridge.emulation.network import network_model

WORLD, ME = 8, 2
NET = network_model("h100_ib400", gpus_per_node=4)


@pytest.fixture
def world():
    emulated = start_world(ME, WORLD, NET, datetime.timedelta(minutes=1))
    yield emulated
    dist.destroy_process_group()
    stop_world()


def _all_reduce(op):
    t = torch.tensor([2.0, 3.0])
    dist.all_reduce(t, op=op)
    return t.tolist()


@pytest.mark.parametrize(
    "op, expected",
    [
        (dist.ReduceOp.SUM, [16.0, 24.0]),
        (dist.ReduceOp.AVG, [2.0, 3.0]),
        (dist.ReduceOp.MAX, [2.0, 3.0]),
        (dist.ReduceOp.MIN, [2.0, 3.0]),
        (dist.ReduceOp.PRODUCT, [2.0**8, 3.0**8]),
    ],
    ids=["sum", "avg", "max", "min", "product"],
)
def test_all_reduce_is_what_eight_identical_ranks_give(world, op, expected):
    assert _all_reduce(op) == expected


def test_all_gather_replicates_and_an_in_place_gather_keeps_the_other_chunks(world):
    out = torch.empty(WORLD * 2)
    dist.all_gather_into_tensor(out, torch.tensor([1.0, 2.0]))
    assert out.tolist() == [1.0, 2.0] * WORLD
    buffer = torch.arange(float(WORLD * 2))  # a parameter buffer; this rank owns chunk ME
    dist.all_gather_into_tensor(buffer, buffer[2 * ME : 2 * ME + 2])
    assert buffer.tolist() == [float(i) for i in range(WORLD * 2)]


def test_reduce_scatter_returns_this_ranks_chunk_summed_over_the_world(world):
    out = torch.empty(2)
    dist.reduce_scatter_tensor(out, torch.arange(float(WORLD * 2)))
    assert out.tolist() == [WORLD * 4.0, WORLD * 5.0]


def test_all_to_all_returns_from_every_peer_the_rows_this_rank_sends_itself(world):
    splits = [1, 0, 2, 1, 1, 1, 1, 1]  # 2 rows for this rank (rank 2): rows 1 and 2
    rows = torch.arange(8.0).unsqueeze(1)
    out = torch.empty(2 * WORLD, 1)
    dist.all_to_all_single(out, rows, [2] * WORLD, splits)
    assert out.view(-1).tolist() == [1.0, 2.0] * WORLD


def test_all_to_all_with_other_sizes_holds_this_ranks_rows_once_then_zeros(world):
    rows = torch.arange(1.0, 9.0).unsqueeze(1)
    out = torch.full((WORLD * 3, 1), -1.0)
    dist.all_to_all_single(out, rows, [3] * WORLD, [1] * WORLD)  # this rank sends itself 1 row
    assert out.view(-1).tolist() == [3.0] + [0.0] * (WORLD * 3 - 1)


class _AtenCalls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_combine_costs_the_host_one_copy_and_one_fill(world):
    """A combine's chunks are what this rank sent each peer: uneven. The stand-in values it returns
    must not cost a kernel per peer, nor an index built on the device."""
    tokens, out = torch.ones(WORLD * ME, 4), torch.empty(sum(range(WORLD)), 4)
    with _AtenCalls() as ops:
        dist.all_to_all_single(out, tokens, list(range(WORLD)), [ME] * WORLD)
    assert len(ops.calls) <= 6, ops.calls  # views of the input and output, one copy, one fill


def test_every_collective_is_charged_the_network_models_time(world):
    world.record.take()
    dist.all_reduce(torch.zeros(1000))  # 8 ranks over 2 nodes: the NIC
    rows = torch.zeros(8, 100)  # 400 bytes a row; 1 row to each peer
    dist.all_to_all_single(torch.empty(8, 100), rows)
    step = world.record.take()["groups"][f"world[{WORLD}]"]
    # the rings cross nodes over the NICs of the group's 4 GPUs in a node (4 x 47 GB/s, slower than NVLink)
    ring = NET.inter_node_latency_us * 1e-6 + 2 * 7 / 8 * 4000 / (4 * NET.inter_node_gbps * 1e9)
    host = pytest.approx(0.05, abs=0.05)  # what the call cost this host: timed, not modeled
    assert step["all_reduce"] == {
        "calls": 1,
        "bytes": 4000,
        "inter_node_bytes": 7000,
        "modeled_s": pytest.approx(ring),
        "host_s": host,
    }
    intra, inter = 3 * 400, 4 * 400  # ranks 0, 1, 3 share rank 2's node; 4..7 are the other node
    a2a = max(
        NET.intra_node_latency_us * 1e-6 + intra / (NET.intra_node_gbps * 1e9),
        NET.inter_node_latency_us * 1e-6 + inter / (NET.inter_node_gbps * 1e9),
    )
    assert step["all_to_all"] == {
        "calls": 1,
        "bytes": 2800,
        "inter_node_bytes": inter,
        "modeled_s": pytest.approx(a2a),
        "host_s": host,
    }


@pytest.mark.parametrize(
    "call",
    [
        lambda: dist.send(torch.zeros(1), dst=3),
        lambda: dist.recv(torch.zeros(1), src=3),
        lambda: dist.gather(torch.zeros(1), dst=0),
    ],
    ids=["send", "recv", "gather"],
)
def test_what_symmetry_cannot_answer_is_refused(world, call):
    with pytest.raises(EmulationUnsupported, match="cannot say what a peer would send"):
        call()


def test_the_host_time_of_each_collective_goes_to_its_own_tally(world):
    world.record.take()
    dist.all_reduce(torch.ones(4))
    dist.all_gather_into_tensor(torch.empty(WORLD * 4), torch.ones(4))
    step = world.record.take()
    tallies = [kinds[kind] for kinds in step["groups"].values() for kind in kinds]
    assert len(tallies) == 2 and all(t["host_s"] > 0 for t in tallies)
    assert sum(t["host_s"] for t in tallies) == pytest.approx(step["host_s"])


def test_all_to_all_leaves_the_output_rows_past_the_received_ones_alone(world):
    """A receive buffer of worst-case size (the sorted dispatcher's): NCCL writes only the received rows."""
    rows = torch.arange(8.0).unsqueeze(1)
    out = torch.full((3 * WORLD, 1), -1.0)
    splits = [1, 2, 0, 1, 1, 1, 1, 1]  # 8 rows received
    dist.all_to_all_single(out, rows, splits, [1] * WORLD)
    assert out.view(-1).tolist() == [2.0] + [0.0] * 7 + [-1.0] * (2 * WORLD)


def test_a_group_is_charged_for_the_network_the_world_has_now(world):
    """Several configs in one process change the world's network between runs; a group made in the
    first (the default group, a dispatcher's own) must charge the next run's network."""
    rows = torch.zeros(8, 100)
    dist.all_to_all_single(torch.empty(8, 100), rows)
    world.record.take()
    world.network = network_model("free")
    dist.all_to_all_single(torch.empty(8, 100), rows)
    assert world.record.take()["modeled_s"] == 0.0
    world.network = NET
    dist.all_to_all_single(torch.empty(8, 100), rows)
    assert world.record.take()["modeled_s"] > 0


def test_even_splits_into_a_larger_buffer_replicate_into_the_received_rows_only(world):
    rows = torch.arange(8.0).unsqueeze(1)  # one row to each peer; this rank's own is row 2
    out = torch.full((2 * WORLD, 1), -1.0)
    dist.all_to_all_single(out, rows, [1] * WORLD, [1] * WORLD)
    assert out.view(-1).tolist() == [2.0] * WORLD + [-1.0] * WORLD
