"""A collective captured in a CUDA graph is issued by the host once and run by the GPU at every
replay: the record keeps it aside at the capture and charges it at each replay."""

from __future__ import annotations

import pytest

from megatron.bridge.emulation.record import CommRecord

CAPTURED = [("ep[16]", "all_gather", 1920, 2e-5, 1024), ("dp[16]", "reduce_scatter", 4000, 1e-4, 3000)]


@pytest.fixture
def record() -> CommRecord:
    record = CommRecord()
    for charge in CAPTURED:
        record.add(*charge, capturing=True)
    return record


def _calls(step: dict) -> dict[tuple[str, str], tuple[int, int, int]]:
    return {
        (group, kind): (t["calls"], t["bytes"], t["inter_node_bytes"])
        for group, kinds in step["groups"].items()
        for kind, t in kinds.items()
    }


def test_a_captured_collective_is_not_charged_at_the_capture(record):
    assert record.take()["groups"] == {}


@pytest.mark.parametrize("replays", [1, 2, 3])
def test_each_replay_charges_every_captured_collective_once(record, replays):
    record.add("world[16]", "barrier", 0, 1e-5)  # eager, in the same step
    for _ in range(replays):
        record.replayed()
    step = record.take()
    assert _calls(step) == {
        ("ep[16]", "all_gather"): (replays, replays * 1920, replays * 1024),
        ("dp[16]", "reduce_scatter"): (replays, replays * 4000, replays * 3000),
        ("world[16]", "barrier"): (1, 0, 0),
    }
    assert step["modeled_s"] == pytest.approx(replays * (2e-5 + 1e-4) + 1e-5)


def test_every_step_that_replays_is_charged_alike(record):
    record.replayed()
    first = record.take()
    record.replayed()
    assert _calls(record.take()) == _calls(first)


def test_a_new_capture_forgets_the_previous_graphs_collectives(record):
    record.forget_capture()
    record.replayed()
    assert record.take()["groups"] == {}
