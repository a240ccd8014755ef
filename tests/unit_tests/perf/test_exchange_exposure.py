"""Which exchanges of an EP-overlap step stay exposed, by their place in megatron-core's schedule, on a
synthetic trace: one layer, two micro-batches (forward 1 alone, forward 2 beside backward 1, backward 2
alone), so eight exchanges of 100 us each, 50 us apart."""

from __future__ import annotations

import json

import pytest
from perf_scripts import load_script
from trace_events import kernel, step

from megatron.bridge.perf.analysis.exchange_exposure import ExchangeCountMismatch, exchange_exposure

EXCHANGE_US, COMM, COMPUTE = 100, 9, 7
COVERED_US = [0, 0, 100, 50, 0, 100, 0, 0]
"""Compute on another stream under each exchange: the unpaired ones none; of the paired layer the
combine's backward fully, the dispatch's forward half, its backward none, the combine's forward fully."""


def _trace(exchanges: int = 8) -> dict:
    events = [step(6, 0, 2000)]
    for index in range(exchanges):
        start = index * 150
        events.append(kernel("emulated_nvshmem_all_to_all", start, EXCHANGE_US, COMM))
        if index < len(COVERED_US) and COVERED_US[index]:
            events.append(kernel("gemm", start, COVERED_US[index], COMPUTE))
    events.append(kernel("gemm_same_stream", 0, 2000, COMM))  # the exchange's own stream covers nothing
    return {"traceEvents": events}


def test_each_exchange_is_charged_to_its_place_in_the_schedule():
    assert exchange_exposure(_trace(), layers=1, micro_batches=2) == {
        "first_forward": {"ms": 0.2, "exposed_ms": 0.2},
        "last_backward": {"ms": 0.2, "exposed_ms": 0.2},
        "paired": {
            "combine_backward": {"ms": 0.1, "exposed_ms": 0.0},
            "dispatch_forward": {"ms": 0.1, "exposed_ms": 0.05},
            "dispatch_backward": {"ms": 0.1, "exposed_ms": 0.1},
            "combine_forward": {"ms": 0.1, "exposed_ms": 0.0},
        },
    }


def test_a_step_whose_exchanges_do_not_match_the_schedule_is_refused():
    with pytest.raises(ExchangeCountMismatch, match="holds 12 dispatch/combine kernels, not 4 x 1 layers x 2"):
        exchange_exposure(_trace(12), layers=1, micro_batches=2)


@pytest.mark.parametrize("micro_batches, code", [(2, 0), (3, 2)], ids=["matches", "mismatch"])
def test_the_script_writes_the_split_or_says_why_not(tmp_path, capsys, micro_batches, code):
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(_trace()))
    script = load_script("ep_exchange_exposure.py")
    out = tmp_path / "split.json"
    assert script.main([str(trace), "--layers", "1", "--micro-batches", str(micro_batches), "--json", str(out)]) == code
    if code:
        assert "not 4 x 1 layers x 3 micro-batches = 12" in capsys.readouterr().err and not out.exists()
    else:
        assert json.loads(out.read_text())["paired"]["dispatch_backward"] == {"ms": 0.1, "exposed_ms": 0.1}


@pytest.mark.parametrize(
    "arm, exchanges, split",
    [("on", 8, True), ("off", 8, False), ("on", 12, False)],
    ids=["overlap-on", "overlap-off", "several-kernels-an-exchange"],
)
def test_the_benchmark_adds_the_split_to_a_profiled_overlap_row(tmp_path, arm, exchanges, split):
    from megatron.bridge.perf.benchmarks import emulation_benchmark as bench

    case = bench.Case(arm, "h100_ib400", "sorted_nvshmem_graph", 0, 1, 2, 12, "h200", profile=True, micro_batches=2)
    trace = tmp_path / "profile" / f"trace_rank0_steps{case.profiled_step}-{case.profiled_step}.json"
    trace.parent.mkdir()
    trace.write_text(json.dumps(_trace(exchanges)))
    profile = bench.case_result(case, {}, 4, tmp_path)["profile"]
    assert profile["dispatch_combine_ms"] > 0 and ("exchange_exposure" in profile) == split
