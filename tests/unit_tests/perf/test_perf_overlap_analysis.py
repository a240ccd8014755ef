"""Interval maths and classification of the overlap analysis, on synthetic Chrome traces."""

import json
import random

import pytest
from trace_events import kernel, step

from megatron.bridge.perf.analysis.overlap_analysis import (
    ComputeBeside,
    Coverage,
    Event,
    analyze_trace,
    classify,
    hidden_intervals,
    intersect,
    total,
    union,
)
from megatron.bridge.perf.analysis.overlap_analysis_cli import main as analyze_main


def cpu_op(name, ts, dur, **args):
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": args}


A2A = "ncclDevKernel_AllToAll_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


@pytest.mark.parametrize(
    "intervals, expected",
    [
        ([], []),
        ([(0, 1)], [(0, 1)]),
        ([(0, 2), (1, 3)], [(0, 3)]),
        ([(2, 3), (0, 1)], [(0, 1), (2, 3)]),
        ([(0, 1), (1, 2)], [(0, 2)]),
        ([(0, 10), (2, 3), (4, 5)], [(0, 10)]),
        ([(1, 1), (0, 0.5)], [(0, 0.5)]),
    ],
)
def test_union(intervals, expected):
    assert union(intervals) == expected


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ([(0, 10)], [(2, 4), (6, 8)], [(2, 4), (6, 8)]),
        ([(0, 5)], [(5, 10)], []),
        ([(0, 4), (6, 10)], [(3, 7)], [(3, 4), (6, 7)]),
        ([(0, 3), (2, 6)], [(1, 2), (1, 5)], [(1, 5)]),  # inputs merged first, no double count
        ([], [(0, 1)], []),
    ],
)
def test_intersect(a, b, expected):
    assert intersect(a, b) == expected


@pytest.mark.parametrize(
    "intervals, asked",
    [
        ([(2, 4), (6, 8)], (0, 10)),
        ([(2, 4), (6, 8)], (3, 7)),
        ([(0, 3), (2, 6)], (1, 2)),  # overlapping input: merged first
        ([(5, 10)], (0, 5)),  # touching, not covering
        ([(0, 1)], (2, 2)),  # an empty interval covers nothing
        ([], (0, 1)),
    ],
)
def test_coverage_clips_an_interval_as_intersect_does(intervals, asked):
    assert Coverage(intervals).clip(*asked) == intersect([asked], intervals)
    assert Coverage(intervals).covered(*asked) == total(intersect([asked], intervals))


def _random_events(seed: int, kernels: int, streams: int) -> list[Event]:
    rng = random.Random(seed)
    events = []
    for index in range(kernels):
        start = rng.uniform(0, 1000)
        kind = "a2a" if index % 5 == 0 else "compute"
        events.append(Event(f"k{index}", kind, start, start + rng.uniform(0, 60), f"gpu:{rng.randrange(streams)}"))
    return events


@pytest.mark.parametrize("seed, streams", [(0, 1), (1, 2), (2, 7), (3, 40)])
def test_hidden_time_is_each_exchange_against_the_union_of_compute_on_other_streams(seed, streams):
    """The per-stream bisection gives what merging every other stream's compute and intersecting does."""
    events = _random_events(seed, 400, streams)
    expected = []
    for stream in {e.stream for e in events if e.kind == "a2a"}:
        beside = [(e.start, e.end) for e in events if e.kind == "compute" and e.stream != stream]
        comm = [(e.start, e.end) for e in events if e.kind == "a2a" and e.stream == stream]
        expected.extend(intersect(comm, beside))
    assert hidden_intervals(events) == union(expected)
    one = next(e for e in events if e.kind == "a2a")
    others = [(e.start, e.end) for e in events if e.kind == "compute" and e.stream != one.stream]
    assert ComputeBeside(events).covered(one.stream, one.start, one.end) == pytest.approx(
        total(intersect([(one.start, one.end)], others))
    )


def test_total_is_union_length_not_sum():
    assert total([(0, 10), (5, 15)]) == 15


@pytest.mark.parametrize(
    "name, cat, kind",
    [
        (A2A, "kernel", "a2a"),
        ("ncclKernel_AllToAll", "kernel", "a2a"),
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "kernel", "a2a"),
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "kernel", "other_comm"),
        ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "kernel", "other_comm"),
        ("void deep_ep::intranode::dispatch<8, 768>(...)", "kernel", "a2a"),
        ("void deep_ep::internode::combine<...>(...)", "kernel", "a2a"),
        ("deep_ep::intranode::notify_dispatch", "kernel", "a2a"),
        ("hybrid_ep::dispatch_kernel<...>", "kernel", "a2a"),
        ("HybridEP combine kernel", "kernel", "a2a"),
        ("emulated_nvshmem_all_to_all", "kernel", "a2a"),  # the emulated world's NVSHMEM exchange
        ("void c10d::nvshmem_extension::allToAllV(void*, long*, ...)", "kernel", "a2a"),
        ("nvshmemi_team_barrier_kernel", "kernel", "other_comm"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", "kernel", "compute"),
        ("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", "ignore"),
        ("c10d::alltoall_base_", "cpu_op", "a2a_cpu"),
        ("gloo:all_to_all", "cpu_op", "a2a_cpu"),
        ("aten::mm", "cpu_op", "ignore"),
        ("cudaLaunchKernel", "cuda_runtime", "ignore"),
    ],
)
def test_classify(name, cat, kind):
    assert classify(name, cat) == kind


def test_classify_sendrecv_optional_and_record_param_comms():
    assert classify("ncclDevKernel_SendRecv", "kernel", include_sendrecv=False) == "other_comm"
    assert classify("record_param_comms", "cpu_op", {"Collective name": "all_to_allv"}) == "a2a_cpu"
    assert classify("record_param_comms", "cpu_op", {"Collective name": "allreduce"}) == "ignore"


def _trace(*events):
    return {"traceEvents": list(events)}


def test_hidden_is_intersection_with_compute_on_other_streams():
    # step 0..100 us; a2a on stream 20 at 10..50; compute on stream 7 at 0..30 and 20..40 (overlapping
    # each other: union 0..40), compute on the comm's own stream at 40..60 (cannot hide it).
    trace = _trace(
        step(1, 0, 100),
        kernel(A2A, 10, 40, 20),
        kernel("gemm", 0, 30, 7),
        kernel("gemm", 20, 20, 7),
        kernel("gemm_same_stream", 40, 20, 20),
    )
    a = analyze_trace(trace, expert_parallel_size=2)
    assert a.comm_ms == pytest.approx(0.040)
    assert a.hidden_ms == pytest.approx(0.030)  # 10..40
    assert a.exposed_ms == pytest.approx(0.010)
    assert a.exposed_share == pytest.approx(0.10)
    assert a.step_time_ms == pytest.approx(0.100)
    assert "turn EP overlap on" in a.decision()


def test_fully_hidden_and_concurrent_comm_not_double_counted():
    trace = _trace(
        step(1, 0, 100),
        kernel(A2A, 10, 20, 20),
        kernel(A2A, 15, 20, 21),  # concurrent a2a on another stream: union 10..35
        kernel("gemm", 0, 100, 7),
    )
    a = analyze_trace(trace, expert_parallel_size=4)
    assert a.comm_ms == pytest.approx(0.025)
    assert a.hidden_ms == pytest.approx(0.025)
    assert a.exposed_ms == pytest.approx(0.0)
    assert "little" in a.decision()


def test_only_profiled_steps_count_and_multiple_steps():
    trace = _trace(
        kernel(A2A, -50, 40, 20),  # before the first profiled step: ignored
        step(5, 0, 100),
        step(6, 100, 100),
        kernel(A2A, 90, 20, 20),  # straddles both steps: 10+10
        kernel(A2A, 250, 10, 20),  # after the last step: ignored
    )
    a = analyze_trace(trace, expert_parallel_size=2)
    assert a.num_steps == 2
    assert a.step_time_ms == pytest.approx(0.200)
    assert a.comm_ms == pytest.approx(0.020)
    assert a.exposed_share == pytest.approx(0.10)


def test_a_step_marked_on_cpu_and_gpu_streams_counts_once():
    gpu_mark = lambda n, ts, dur, stream: {**step(n, ts, dur), "cat": "gpu_user_annotation", "tid": stream}  # noqa: E731
    trace = _trace(
        step(4, 0, 100),
        gpu_mark(4, 5, 110, 7),
        gpu_mark(4, 20, 90, 20),
        step(5, 100, 100),
        gpu_mark(5, 115, 95, 7),
        kernel(A2A, 50, 20, 20),
    )
    a = analyze_trace(trace, expert_parallel_size=2)
    assert a.num_steps == 2
    assert a.step_time_ms == pytest.approx(0.210)  # union of all marks: 0 .. 210 us
    assert "105.000 ms" not in a.format() and "0.105 ms" in a.format()


def test_no_step_markers_uses_event_span():
    a = analyze_trace(_trace(kernel(A2A, 0, 10, 20), kernel("gemm", 10, 30, 7)))
    assert a.step_time_ms == pytest.approx(0.040) and a.exposed_ms == pytest.approx(0.010)


def test_ep1_and_no_comm_decisions():
    assert "EP=1" in analyze_trace(_trace(kernel("gemm", 0, 10, 7)), expert_parallel_size=1).decision()
    none = analyze_trace(_trace(step(1, 0, 10), kernel("gemm", 0, 10, 7)), expert_parallel_size=2)
    assert none.comm_kernels == 0 and "gloo" in none.decision()


def test_gloo_cpu_ops_used_only_without_comm_kernels():
    gloo = _trace(step(1, 0, 100), cpu_op("c10d::alltoall_base_", 10, 40), kernel("gemm", 0, 30, 7))
    a = analyze_trace(gloo, expert_parallel_size=2)
    assert a.comm_ms == pytest.approx(0.040) and a.hidden_ms == pytest.approx(0.020)
    nccl = _trace(step(1, 0, 100), cpu_op("c10d::alltoall_base_", 0, 5), kernel(A2A, 10, 10, 20))
    assert analyze_trace(nccl).comm_ms == pytest.approx(0.010)  # the CPU launch op is not comm time
    assert analyze_trace(nccl, include_cpu_ops=True).comm_ms == pytest.approx(0.015)
    assert analyze_trace(gloo, include_cpu_ops=False).comm_kernels == 0


def _summary(ep: int, overlap_on: bool) -> dict:
    """The parts of a real ``summary.json`` (training/telemetry/metrics.py) the analysis reads."""
    return {
        "parallel_layout": {"tp": 1, "pp": 1, "ep": ep},
        "overlap_report": {"features": {"moe_ep_overlap": {"active": overlap_on, "requested": overlap_on}}},
    }


@pytest.mark.parametrize(
    "overlap_on, expected",
    [(False, "turn EP overlap on"), (True, "EP overlap is already on")],
)
def test_cli_decision_knows_whether_overlap_was_on(tmp_path, capsys, overlap_on, expected):
    run = tmp_path / "run"
    (run / "profile").mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(_summary(ep=4, overlap_on=overlap_on)))
    trace = run / "profile" / "trace_rank0_steps4-5.json"
    trace.write_text(json.dumps(_trace(step(1, 0, 100), kernel(A2A, 10, 40, 20))))
    assert analyze_main([str(trace)]) == 0
    text = capsys.readouterr().out
    assert expected in text and "EP=4" in text
    if overlap_on:
        assert "turn EP overlap on" not in text


def test_cli_reads_ep_from_summary_and_writes_json(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "profile").mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(_summary(ep=2, overlap_on=False)))
    trace = run / "profile" / "rank0.pt.trace.json"
    trace.write_text(json.dumps(_trace(step(1, 0, 100), kernel(A2A, 10, 40, 20))))
    out = tmp_path / "a.json"
    assert analyze_main([str(trace), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "exposed" in text and "EP=2" in text
    data = json.loads(out.read_text())[str(trace)]
    assert data["exposed_share"] == pytest.approx(0.4)
    assert data["expert_parallel_size"] == 2
