"""The sorted dispatcher's NVSHMEM transport in an emulated world: what it receives, what it is
charged, and that the dispatcher picks it where a cluster of that layout would run NVSHMEM."""

from __future__ import annotations

import datetime
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from megatron.bridge.emulation.backend import start_world, stop_world
from megatron.bridge.emulation.network import network_model
from megatron.bridge.models.dispatch.path_registry import choose_dispatch
from megatron.bridge.models.torch_native.emulated_exchange import EmulatedSymmetricExchange
from megatron.bridge.models.torch_native.symmetric_exchange import make_exchange
from megatron.bridge.models.torch_native.token_exchange import Route

ME = 2
NET = network_model("h100_ib400", gpus_per_node=4)


@pytest.fixture(params=[8], ids=lambda n: f"world{n}")
def world(request):
    emulated = start_world(ME, request.param, NET, datetime.timedelta(minutes=1))
    yield emulated
    dist.destroy_process_group()
    stop_world()


def _route(send: list[int], recv: list[int], source_rows: int) -> Route:
    return Route(torch.tensor(send), torch.tensor(recv), source_rows * len(send), source_rows)


def _exchange(route: Route, sources: list[torch.Tensor]) -> torch.Tensor:
    exchange = make_exchange(dist.group.WORLD, torch.device("cpu"), prefer_symmetric=True)
    assert isinstance(exchange, EmulatedSymmetricExchange) and exchange.sync_free
    return exchange.exchange(sources, route, lambda recv: recv[: int(route.recv_splits.sum())].clone())


def test_every_peer_sends_the_rows_this_rank_sends_itself(world):
    # 8 ranks; this rank (2) sends itself its rows 3..4 (after 1 + 2 rows to ranks 0 and 1)
    send = [1, 2, 2, 0, 1, 0, 0, 1]
    rows = torch.arange(7.0).unsqueeze(1)
    received = _exchange(_route(send, [2] * 8, 4), [rows])
    assert received.view(torch.float32).view(-1, 16)[:, 0].tolist() == [3.0, 4.0] * 8


@pytest.mark.parametrize(
    "send, expected",
    [
        ([1, 2, 2, 0, 1, 0, 0, 1], [3.0, 4.0, 3.0, 3.0]),  # its own two rows, cycled
        ([1, 2, 0, 0, 1, 0, 0, 1], [0.0, 1.0, 2.0, 0.0]),  # it sends itself nothing: all 5 sent rows, cycled
    ],
    ids=["own-rows-cycled", "no-own-rows"],
)
def test_a_peer_that_sends_more_than_this_rank_sends_itself_never_reads_padding(world, send, expected):
    rows = torch.arange(7.0).unsqueeze(1)  # rows past the sent ones are padding (no values on a GPU)
    received = _exchange(_route(send, [0, 3, 0, 0, 0, 0, 0, 1], 4), [rows])
    assert received.view(torch.float32).view(-1, 16)[:, 0].tolist() == expected


def test_an_exchange_is_charged_one_call_per_peer_in_turn(world):
    send = [1, 2, 2, 0, 1, 0, 0, 1]
    _exchange(_route(send, [2] * 8, 4), [torch.zeros(7, 16)])  # 64-byte rows
    tally = world.record.take()["groups"]["world[8]"]["all_to_all"]
    # 7 calls, one per peer (ranks paired by XOR), each a 15 us barrier (the group spans nodes) and its
    # slowest pair, the one into a rank that every rank sends 2 rows (ranks 1, 2): in calls 1-3 every pair
    # is in one node (5 us, 370 GB/s), in calls 4-7 every pair crosses the NIC (15 us, 47 GB/s)
    seconds = 7 * 15e-6 + 3 * (5e-6 + 128 / 370e9) + 4 * (15e-6 + 128 / 47e9)
    assert tally["calls"] == 1 and tally["bytes"] == 5 * 64 and tally["inter_node_bytes"] == 2 * 64
    assert tally["modeled_s"] == pytest.approx(seconds, rel=1e-12)


def test_the_counts_gather_replicates_and_is_one_call_to_every_peer(world):
    exchange = make_exchange(dist.group.WORLD, torch.device("cpu"), prefer_symmetric=True)
    gathered = exchange.all_gather(torch.arange(4))
    assert gathered.tolist() == [[0, 1, 2, 3]] * 8
    tally = world.record.take()["groups"]["world[8]"]["all_gather"]
    assert tally["calls"] == 1 and tally["bytes"] == 7 * 64  # one 64-byte row (4 int64 padded) to each peer
    assert tally["modeled_s"] == pytest.approx(15e-6 + 4 * 64 / 47e9, rel=1e-12)  # the NIC is the slower link


def _config(**fields) -> SimpleNamespace:
    base = dict(
        moe_token_dispatcher_type="alltoall",
        moe_expert_capacity_factor=None,
        moe_pad_expert_input_to_capacity=False,
        moe_router_padding_for_quantization=False,
        moe_shared_expert_overlap=False,
        cuda_graph_impl="none",
        pipeline_model_parallel_size=1,
        torch_native_dispatcher="sorted",
        torch_native_ep_transport="auto",
    )
    return SimpleNamespace(**{**base, **fields})


@pytest.mark.parametrize(
    "world, transport, expected",
    [
        (8, "auto", ("nvshmem", True)),
        (8, "nvshmem", ("nvshmem", True)),
        (8, "nccl", ("collective", False)),
        (12, "auto", ("collective", False)),  # EP 12 is no power of two: a cluster would not run NVSHMEM either
    ],
    indirect=["world"],
    ids=["auto", "nvshmem", "nccl", "ep12"],
)
def test_the_sorted_dispatcher_runs_the_emulated_nvshmem_exchange_where_a_cluster_would(world, transport, expected):
    choice = choose_dispatch(
        _config(torch_native_ep_transport=transport), world.world_size, 1, dist.group.WORLD, torch.device("cpu")
    )
    assert (choice.dispatcher, choice.transport, choice.sync_free) == ("sorted", *expected)
    assert ("NVSHMEM EMULATED" in choice.describe()) is expected[1]


@pytest.mark.parametrize("world", [12], indirect=True, ids=["ep12"])
def test_nvshmem_asked_for_where_a_cluster_could_not_run_it_is_an_error(world):
    with pytest.raises(ValueError, match="not a power of two"):
        choose_dispatch(_config(torch_native_ep_transport="nvshmem"), 12, 1, dist.group.WORLD, torch.device("cpu"))
