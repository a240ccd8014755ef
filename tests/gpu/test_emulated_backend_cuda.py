"""The emulated backend on a GPU: collectives are enqueued, never waited for by the host, and a hold
takes the GPU for the modeled time."""

from __future__ import annotations

import datetime
import time

import pytest
import torch
import torch.distributed as dist

from megatron.bridge.emulation.backend import start_world, stop_world
from megatron.bridge.emulation.network import network_model

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
    torch.cuda._sleep(int(BUSY_S * torch.cuda.get_device_properties(0).clock_rate * 1e3))
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
    expected = [v for j in range(WORLD) for v in ([3.0] + [0.0] * (j - 1) if j else [])]
    assert out.view(-1).tolist() == expected


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
