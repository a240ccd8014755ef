"""Where a profiled step's time goes: GPU busy or idle, communication hidden or exposed, host waits.

An extension of :mod:`overlap_analysis` for the question "why is this step longer than its compute?":

* ``gpu_idle_ms``: step time in which no kernel runs on any stream (the GPU waits for the host);
* ``host_wait_ms`` and ``host_waits``: time the host spends blocked in CUDA runtime calls that wait
  for the GPU (stream, event or device synchronisation, and device-to-host copies, which are how a
  ``.tolist()`` or ``.item()`` of a GPU tensor waits), and how many there were;
* the dispatch/combine and other-communication figures of :func:`overlap_analysis.analyze_trace`
  (in an emulated world the modeled collectives are the ``emulated_nccl_*`` kernels);
* where the idle goes: ``idle_behind_host_waits_ms`` (idle while the host waits in one of those
  calls: a synchronisation that starves the GPU), ``idle_in_short_gaps_ms`` (idle in gaps under
  1 ms: the signature of a host too slow to issue the work), and ``host_ops_in_idle_ms``, the
  outermost host operators running during idle gaps of 100 us or more (the most idle first), which
  names what the host was doing while the GPU waited.

All figures are per profiled step (the sum over ``ProfilerStep#N`` spans divided by their number).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from megatron.bridge.perf.analysis.overlap_analysis import (
    _KERNEL_CATS,
    _STEP,
    Coverage,
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
    idle_behind_host_waits_ms: float = 0.0
    idle_in_short_gaps_ms: float = 0.0
    host_ops_in_idle_ms: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {key: _rounded(value) for key, value in asdict(self).items()}


def _rounded(value: Any) -> Any:
    if isinstance(value, dict):
        return {name: round(ms, 3) for name, ms in value.items()}
    return round(value, 3)


SHORT_GAP_US = 1000.0
"""An idle gap shorter than this is the host issuing work too slowly, not a wait for something."""
NAMED_GAP_US = 100.0
"""Idle gaps at least this long have the host operators running in them named."""
NAMED_OPS = 8


Spans = list[tuple[float, float]]


def _spans(trace: dict[str, Any]) -> tuple[Spans, Spans, Spans, dict[Any, list[tuple[float, float, str]]]]:
    """(step spans, kernel intervals, the host's waiting calls inside the steps, host operators by
    thread as ``(start, end, name)``), microseconds."""
    steps, kernels, waits = [], [], []
    host_ops: dict[Any, list[tuple[float, float, str]]] = {}
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
        elif cat == "cpu_op":
            host_ops.setdefault((ev.get("pid"), ev.get("tid")), []).append((start, end, name))
    step_union = union(steps)
    inside = [(start, end) for start, end in waits if any(a <= start < b for a, b in step_union)]
    return step_union, intersect(kernels, step_union), inside, host_ops


def _idle_gaps(steps: Spans, busy: Spans) -> Spans:
    """The steps' time with no kernel running: the gaps between the busy intervals."""
    gaps: Spans = []
    for start, end in steps:
        cursor = start
        for b_start, b_end in busy:
            if b_end <= cursor or b_start >= end:
                continue
            if b_start > cursor:
                gaps.append((cursor, b_start))
            cursor = max(cursor, b_end)
        if cursor < end:
            gaps.append((cursor, end))
    return gaps


def _outermost(ops: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """A thread's operators that no other operator of it encloses (what the host was doing)."""
    out: list[tuple[float, float, str]] = []
    for start, end, name in sorted(ops):
        if out and start < out[-1][1]:
            continue
        out.append((start, end, name))
    return out


def _ops_in_gaps(host_ops: dict[Any, list[tuple[float, float, str]]], gaps: Spans) -> dict[str, float]:
    """Microseconds of overlap of each outermost host operator's name with ``gaps``."""
    idle = Coverage(gaps)
    found: dict[str, float] = {}
    for ops in host_ops.values():
        for start, end, name in _outermost(ops):
            overlap = idle.covered(start, end)
            if overlap > 0:
                found[name] = found.get(name, 0.0) + overlap
    return found


def step_anatomy(trace: dict[str, Any] | str | Path) -> StepAnatomy:
    """The anatomy of the profiled steps of a torch profiler Chrome trace (dict or path)."""
    if not isinstance(trace, dict):
        trace = load_trace(trace)
    steps, kernels, waits, host_ops = _spans(trace)
    overlap = analyze_trace(trace)
    count = max(1, overlap.num_steps)
    busy_spans = union(kernels)
    step, busy = total(steps), total(busy_spans)
    gaps = _idle_gaps(steps, busy_spans)
    per_step = lambda us: us / 1e3 / count  # noqa: E731
    named = _ops_in_gaps(host_ops, [gap for gap in gaps if gap[1] - gap[0] >= NAMED_GAP_US])
    top = sorted(named.items(), key=lambda item: -item[1])[:NAMED_OPS]
    return StepAnatomy(
        step_ms=per_step(step),
        gpu_busy_ms=per_step(busy),
        gpu_idle_ms=per_step(step - busy),
        compute_ms=overlap.compute_ms / count,
        dispatch_combine_ms=overlap.comm_ms / count,
        dispatch_combine_exposed_ms=overlap.exposed_ms / count,
        other_comm_ms=overlap.other_comm_ms / count,
        host_wait_ms=per_step(sum(end - start for start, end in waits)),
        host_waits=len(waits) / count,
        idle_behind_host_waits_ms=per_step(total(intersect(gaps, waits))),
        idle_in_short_gaps_ms=per_step(sum(end - start for start, end in gaps if end - start < SHORT_GAP_US)),
        host_ops_in_idle_ms={name: per_step(us) for name, us in top},
    )


__all__ = ["StepAnatomy", "step_anatomy"]
