"""Where a profiled step's time goes: GPU busy or idle, communication hidden or exposed, host waits.

An extension of :mod:`overlap_analysis` for the question "why is this step longer than its compute?":

* ``gpu_idle_ms``: step time in which no kernel runs on any stream (the GPU waits for the host);
* ``host_wait_ms`` and ``host_waits``: time the host spends blocked in CUDA runtime calls that wait
  for the GPU (stream, event or device synchronisation, and device-to-host copies, which are how a
  ``.tolist()`` or ``.item()`` of a GPU tensor waits), and how many there were;
* the dispatch/combine and other-communication figures of :func:`overlap_analysis.analyze_trace`
  (in an emulated world the modeled collectives are the ``emulated_nccl_*`` kernels).

All figures are per profiled step (the sum over ``ProfilerStep#N`` spans divided by their number).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from megatron.bridge.perf.analysis.overlap_analysis import (
    _KERNEL_CATS,
    _STEP,
    _trace_events,
    analyze_trace,
    intersect,
    load_trace,
    total,
    union,
)

_WAITING_CALLS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "cudaMemcpyAsync",
)


@dataclass(frozen=True)
class StepAnatomy:
    """Per profiled step, in milliseconds (``host_waits``: a count)."""

    step_ms: float
    gpu_busy_ms: float
    gpu_idle_ms: float
    compute_ms: float
    dispatch_combine_ms: float
    dispatch_combine_exposed_ms: float
    other_comm_ms: float
    host_wait_ms: float
    host_waits: float

    def as_dict(self) -> dict[str, float]:
        return {key: round(value, 3) for key, value in asdict(self).items()}


def _spans(trace: dict[str, Any]) -> tuple[list[tuple[float, float]], list[tuple[float, float]], list[float]]:
    """(step spans, kernel intervals, durations of the host's waiting calls), microseconds."""
    steps, kernels, waits = [], [], []
    for ev in _trace_events(trace):
        if ev.get("ph") != "X" or "dur" not in ev:
            continue
        name, cat = str(ev.get("name", "")), str(ev.get("cat", ""))
        start, end = float(ev["ts"]), float(ev["ts"]) + float(ev["dur"])
        if _STEP.match(name) and cat not in ("gpu_user_annotation",):
            steps.append((start, end))
        elif cat in _KERNEL_CATS:
            kernels.append((start, end))
        elif cat == "cuda_runtime" and name in _WAITING_CALLS:
            waits.append((start, end))
    step_union = union(steps)
    inside = [end - start for start, end in waits if any(a <= start < b for a, b in step_union)]
    return step_union, intersect(kernels, step_union), inside


def step_anatomy(trace: dict[str, Any] | str | Path) -> StepAnatomy:
    """The anatomy of the profiled steps of a torch profiler Chrome trace (dict or path)."""
    if not isinstance(trace, dict):
        trace = load_trace(trace)
    steps, kernels, waits = _spans(trace)
    overlap = analyze_trace(trace)
    count = max(1, overlap.num_steps)
    step, busy = total(steps), total(union(kernels))
    per_step = lambda us: us / 1e3 / count  # noqa: E731
    return StepAnatomy(
        step_ms=per_step(step),
        gpu_busy_ms=per_step(busy),
        gpu_idle_ms=per_step(step - busy),
        compute_ms=overlap.compute_ms / count,
        dispatch_combine_ms=overlap.comm_ms / count,
        dispatch_combine_exposed_ms=overlap.exposed_ms / count,
        other_comm_ms=overlap.other_comm_ms / count,
        host_wait_ms=per_step(sum(waits)),
        host_waits=len(waits) / count,
    )


__all__ = ["StepAnatomy", "step_anatomy"]
