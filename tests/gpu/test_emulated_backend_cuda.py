"""The emulated backend on a GPU: collectives are enqueued, never waited for by the host; a hold takes
the GPU for the modeled time. A synchronous collective runs on the issuing stream (as ProcessGroupNCCL
runs one with ``asyncOp`` false) and the compute queued after it waits; an asynchronous one runs on
its group's own stream, beside the compute queued after it, and a later synchronous one of the same
group queues behind it."""

from __future__ import annotations

import datetime
import time

import pytest
import torch
import torch.distributed as dist

from megatron.bridge.emulation.backend import start_world, stop_world
from megatron.bridge.emulation.hold import Hold
from megatron.bridge.emulation.network import network_model

pytestmark = pytest.mark.gpu_timing  # every test here times the GPU or the host behind queued GPU work

WORLD, ME = 8, 2
BUSY_S = 0.2


@pytest.fixture
def world():
    emulated = start_world(ME, WORLD, network_model("h100_ib400", gpus_per_node=4), datetime.timedelta(minutes=1))
    yield emulated
    dist.destroy_process_group()
    stop_world()


def _host_seconds(call) -> float:
    """Host time of ``call`` issued behind ``BUSY_S`` of queued GPU work."""
    torch.cuda.synchronize()
    Hold()(BUSY_S, 1)
    start = time.perf_counter()
    call()
    spent = time.perf_counter() - start
    torch.cuda.synchronize()
    return spent


def test_a_combine_with_uneven_splits_does_not_wait_for_the_gpu(world):
    rows = torch.arange(1.0, 9.0, device="cuda").unsqueeze(1)
    out = torch.full((sum(range(WORLD)), 1), -1.0, device="cuda")
    splits = list(range(WORLD))  # chunk j: j rows, from the one row this rank sends itself
    _host_seconds(lambda: dist.all_to_all_single(out, rows, splits, [1] * WORLD))  # warm-up
    spent = _host_seconds(lambda: dist.all_to_all_single(out, rows, splits, [1] * WORLD))
    assert spent < BUSY_S / 4, f"the host waited {spent * 1e3:.0f} ms for queued GPU work"
    assert out.view(-1).tolist() == [3.0] + [0.0] * (sum(range(WORLD)) - 1)


def test_a_modeled_collective_holds_its_stream_for_the_modeled_time(world):
    # 8 MiB to each peer, 32 MiB of it over the NIC (about 0.7 ms); the backend's own copy of the rows
    # (about 30 us) runs before the hold on the same stream
    rows = torch.zeros(WORLD * 2048, 2048, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(rows)
    dist.all_to_all_single(out, rows)
    world.record.take()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    dist.all_to_all_single(out, rows)
    end.record()
    end.synchronize()
    modeled = world.record.take()["modeled_s"]
    assert modeled > 1e-4
    assert start.elapsed_time(end) * 1e-3 == pytest.approx(modeled, rel=0.1, abs=5e-5)


def _gpu_seconds(call) -> float:
    """GPU time of ``call``, issued behind ``BUSY_S`` of queued GPU work: the host's time to issue it
    is hidden, so the events time the GPU alone."""
    torch.cuda.synchronize()
    Hold()(BUSY_S, 1)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3


@pytest.mark.parametrize("async_op", [True, False], ids=["async-beside-compute", "sync-waited-for"])
def test_an_async_collective_runs_beside_the_compute_after_it_and_a_sync_one_before_it(world, async_op):
    grads = torch.zeros(8 * 2**20, device="cuda")  # 32 MiB: a ring all-reduce over the NIC, about 1.1 ms
    dist.all_reduce(grads)
    modeled = world.record.take()["modeled_s"]
    compute = Hold()

    def step():
        work = dist.all_reduce(grads, async_op=async_op)
        compute(modeled, 1)  # compute queued after the collective, on the issuing stream
        if async_op:
            work.wait()

    step()
    elapsed = _gpu_seconds(step)
    if async_op:
        assert elapsed < 1.5 * modeled, f"{elapsed * 1e3:.2f} ms: the all-reduce did not run beside the compute"
    else:
        assert elapsed > 1.8 * modeled, f"{elapsed * 1e3:.2f} ms: the compute did not wait for the all-reduce"


def test_a_sync_collective_runs_on_the_issuing_stream_and_leaves_nothing_to_wait_for(world):
    tokens = torch.ones(WORLD * 64, 2048, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(tokens)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        work = dist.all_to_all_single(out, tokens, async_op=False)
        dist.all_reduce(tokens[:1])
    assert work is None or work.is_completed()
    assert world.streams == {}, "a synchronous collective used a stream of its own"
    dist.all_reduce(tokens[:1], async_op=True).wait()
    assert len(world.streams) == 1


def test_a_sync_collective_queues_behind_an_async_one_of_its_group(world):
    group = dist.new_group(list(range(4)))  # one node: no NIC, so only the order can serialise them
    grads = torch.zeros(16 * 2**20, device="cuda")
    dist.all_reduce(grads, group=group)
    one = world.record.take()["modeled_s"]

    def both():
        dist.all_reduce(grads, group=group, async_op=True)
        dist.all_reduce(grads, group=group)

    both()
    elapsed = _gpu_seconds(both)
    assert elapsed > 1.8 * one, f"{elapsed * 1e3:.2f} ms against {one * 1e3:.2f} ms each: they ran at once"


def _nvshmem_exchange_args(world_size: int, rows_per_peer: int):
    from megatron.bridge.models.torch_native.token_exchange import Route

    send = torch.full((world_size,), rows_per_peer, device="cuda")
    route = Route(send, send.clone(), world_size * rows_per_peer, rows_per_peer)
    return [torch.ones(world_size * rows_per_peer, 2048, device="cuda", dtype=torch.bfloat16)], route


def test_the_emulated_nvshmem_exchange_never_waits_for_the_gpu_and_holds_for_its_modeled_time(world):
    from megatron.bridge.models.torch_native.symmetric_exchange import make_exchange

    exchange = make_exchange(dist.group.WORLD, torch.device("cuda"), prefer_symmetric=True)
    sources, route = _nvshmem_exchange_args(WORLD, 256)  # 1 MiB to each peer, 4 of them over the NIC

    def call():
        exchange.exchange(sources, route, lambda recv: None)

    _host_seconds(call)  # warm-up: the kernels compile
    world.record.take()
    spent = _host_seconds(call)
    assert spent < BUSY_S / 4, f"the host waited {spent * 1e3:.0f} ms for queued GPU work"
    tally = world.record.take()["groups"]["world[8]"]["all_to_all"]
    row = 2048 * 2  # bf16 values
    cost = dist.group.WORLD.costs.serial_all_to_all([256 * row] * WORLD)
    seconds = cost.seconds
    assert (tally["calls"], tally["bytes"], tally["inter_node_bytes"]) == (1, cost.sent_bytes, cost.inter_node_bytes)
    assert tally["modeled_s"] == pytest.approx(seconds, rel=1e-3)  # float32 on the GPU
    elapsed = _gpu_seconds(call)  # the hold, and the exchange's own copies beside it (tens of microseconds)
    assert 0.97 * seconds < elapsed < 1.1 * seconds + 1e-4, f"{elapsed * 1e3:.3f} ms against {seconds * 1e3:.3f} ms"


@pytest.mark.parametrize("ranks, shared", [(range(WORLD), True), (range(4), False)], ids=["across-nodes", "one-node"])
def test_collectives_running_at_once_share_the_nic_and_not_nvlink(world, ranks, shared):
    """Two all-reduces on two groups (two streams), issued together: across nodes the second sends after
    the first (the NIC ledger), so both take about twice one's time; inside one node they run side by side.
    Each is timed against one all-reduce alone, measured the same way (a sum's real kernel included)."""
    groups = [dist.new_group(list(ranks)) for _ in range(2)]
    grads = [torch.zeros(16 * 2**20, device="cuda") for _ in groups]  # 64 MiB each

    def run(count):
        works = [dist.all_reduce(g, group=group, async_op=True) for g, group in zip(grads[:count], groups)]
        for work in works:
            work.wait()

    run(2)  # warm-up
    one, both = _gpu_seconds(lambda: run(1)), _gpu_seconds(lambda: run(2))
    shown = f"both {both * 1e3:.2f} ms against one {one * 1e3:.2f} ms"
    if shared:
        assert both > 1.7 * one, f"{shown}: the NIC was not shared"
    else:
        assert both < 1.3 * one, f"{shown}: NVLink was queued"
