"""Where a profiled step's time goes, on synthetic Chrome traces of an emulated step."""

import pytest
from trace_events import kernel, step

from megatron.bridge.perf.analysis.overlap_analysis import classify
from megatron.bridge.perf.analysis.step_anatomy import step_anatomy


def _runtime(name, ts, dur):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


@pytest.mark.parametrize(
    "name, kind",
    [
        ("emulated_nccl_all_to_all", "a2a"),  # the emulated world's dispatch/combine
        ("emulated_nccl_collective", "other_comm"),  # its gradient and parameter collectives
        ("_spin_until", "compute"),
    ],
)
def test_the_emulated_worlds_kernels_read_as_nccls(name, kind):
    assert classify(name, "kernel") == kind


def test_an_emulated_step_splits_into_compute_communication_idle_and_host_waits():
    trace = {
        "traceEvents": [
            step(5, 0, 1000),
            kernel("gemm", 0, 400, 7),  # compute on the default stream
            kernel("emulated_nccl_all_to_all", 300, 200, 9),  # 100 under the gemm, 100 exposed
            kernel("emulated_nccl_collective", 600, 100, 9),
            _runtime("cudaStreamSynchronize", 420, 150),  # the host waits for the GPU
            _runtime("cudaMemcpyAsync", 800, 50),  # a .tolist() of a GPU tensor
            _runtime("cudaLaunchKernel", 10, 5),  # not a wait
            _runtime("cudaStreamSynchronize", 2000, 90),  # outside the profiled step
        ]
    }
    anatomy = step_anatomy(trace).as_dict()
    assert anatomy == {
        "step_ms": 1.0,
        "gpu_busy_ms": 0.6,
        "gpu_idle_ms": 0.4,
        "compute_ms": 0.4,
        "dispatch_combine_ms": 0.2,
        "dispatch_combine_exposed_ms": 0.1,
        "other_comm_ms": 0.1,
        "host_wait_ms": 0.2,
        "host_waits": 2,
        "idle_behind_host_waits_ms": 0.12,  # 500-570 under the synchronisation, 800-850 under the copy
        "idle_in_short_gaps_ms": 0.4,
        "host_ops_in_idle_ms": {},
    }


def _host_op(name, ts, dur, thread=1):
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": thread}


def test_the_idle_is_split_by_gap_length_and_named_by_the_outermost_host_operators_in_it():
    trace = {
        "traceEvents": [
            step(5, 0, 5000),
            kernel("gemm", 0, 100, 7),
            kernel("gemm", 400, 1600, 7),  # gaps: 100-400 (short) and 2000-4500 (long)
            kernel("gemm", 4500, 500, 7),
            _host_op("autograd::engine::evaluate_function: CatBackward0", 100, 300),
            _host_op("aten::narrow", 150, 10),  # inside the backward: not counted again
            _host_op("_AllToAll", 1900, 1100),  # 1000 of it in the long gap
            _host_op("aten::mm", 3500, 50, thread=2),
            _host_op("aten::add", 4600, 50),  # while the GPU is busy
        ]
    }
    anatomy = step_anatomy(trace).as_dict()
    assert (anatomy["gpu_idle_ms"], anatomy["idle_in_short_gaps_ms"]) == (2.8, 0.3)
    assert list(anatomy["host_ops_in_idle_ms"].items()) == [
        ("_AllToAll", 1.0),
        ("autograd::engine::evaluate_function: CatBackward0", 0.3),
        ("aten::mm", 0.05),
    ]
