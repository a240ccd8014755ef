"""The hold kernel's launch: compiled once and launched through Triton's compiled launcher on the current
stream (``triton-direct``), for the modeled time, inside a CUDA-graph capture as outside, at a host cost
below Triton's own launch; where the direct launch cannot be made, Triton's own launch holds instead."""

from __future__ import annotations

import time

import pytest
import torch

from megatron.bridge.emulation import hold as hold_module
from megatron.bridge.emulation.hold import Hold

pytestmark = [
    pytest.mark.gpu_timing,  # every test here times the GPU or the host: run alone on the GPU
    pytest.mark.skipif(hold_module.triton is None, reason="needs Triton (the hold kernel is written in it)"),
]


def _held_seconds(hold: Hold, seconds: float, **kwargs) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    hold(seconds, 4, **kwargs)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3


def _refuse(*args, **kwargs):
    raise TypeError("launcher signature differs")


@pytest.fixture
def plain_triton(monkeypatch) -> Hold:
    """A hold, already chosen, whose direct launch could not be made (as with a Triton whose launcher
    differs)."""
    with monkeypatch.context() as patch:
        patch.setattr(hold_module._DirectLaunch, "__init__", _refuse)
        hold = Hold()
        hold(1e-5, 1)
    return hold


@pytest.mark.parametrize("seconds", [1e-3, 3.0], ids=["1ms", "past-2**31-ns"])
@pytest.mark.parametrize("all_to_all", [True, False], ids=["all-to-all", "collective"])
def test_the_direct_launch_holds_the_stream_for_the_modeled_time(seconds, all_to_all):
    hold = Hold()
    hold(1e-5, 1)  # the first hold chooses the launch (compiles, checks it against the GPU's timer)
    held = _held_seconds(hold, seconds, all_to_all=all_to_all)
    assert hold.kind == "triton-direct"
    assert seconds <= held < 1.05 * seconds + 2e-4


def test_the_direct_launch_is_captured_by_a_cuda_graph_and_holds_at_each_replay():
    hold = Hold()
    hold(1e-5, 1)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        hold(2e-3, 4, all_to_all=True)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    graph.replay()
    end.record()
    end.synchronize()
    assert 4e-3 <= start.elapsed_time(end) * 1e-3 < 4.4e-3


def test_without_the_direct_launch_triton_s_own_launch_holds(plain_triton):
    assert plain_triton.kind == "triton"
    assert 2e-3 <= _held_seconds(plain_triton, 2e-3) < 2.2e-3


def _host_seconds_a_hold(hold: Hold, calls: int = 200) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        hold(1e-6, 1)
    spent = (time.perf_counter() - start) / calls
    torch.cuda.synchronize()
    return spent


def test_the_direct_launch_costs_the_host_less_than_triton_s_own(plain_triton):
    direct = Hold()
    direct(1e-5, 1)
    pairs = [(_host_seconds_a_hold(direct), _host_seconds_a_hold(plain_triton)) for _ in range(5)]
    best_direct, best_plain = min(d for d, _ in pairs), min(p for _, p in pairs)
    assert best_direct < best_plain, f"direct {best_direct * 1e6:.1f} us a hold, Triton's {best_plain * 1e6:.1f} us"
