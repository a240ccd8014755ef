"""A few numbers that say where a profiled training step's time goes, read from its Chrome trace.

``pretrain()`` writes the trace with ``profiling.use_pytorch_profiler`` (``training/telemetry/profiling.py``).
:func:`summarize` gives, per captured step: its wall time, how many kernels ran, how long the GPU
was busy (the union of kernel intervals over all streams) and so how long it waited for the host;
over the capture: the kernels and the host operations that took longest, and the host's waits on
the device (synchronisations and blocking copies). A step whose GPU is busy for a small share of
its wall time is host-bound: the GPU waits on Python or on a synchronisation.
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from megatron.bridge.perf.analysis.overlap_analysis import total

_STEP = re.compile(r"ProfilerStep#(\d+)")
HOST_WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpyAsync")
"""Runtime calls in which the host can wait for the device."""


def _events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]


def _top(durations: dict[str, list[float]], n: int) -> list[dict[str, Any]]:
    ranked = sorted(durations.items(), key=lambda kv: -sum(kv[1]))[:n]
    return [
        dict(name=name[:120], calls=len(d), total_ms=round(sum(d) / 1e3, 3), mean_ms=round(sum(d) / len(d) / 1e3, 4))
        for name, d in ranked
    ]


def summarize(trace: dict[str, Any], top: int = 10) -> dict[str, Any]:
    """The summary of one trace (times in ms)."""
    events = _events(trace)
    steps = sorted(
        ((int(m.group(1)), e) for e in events if (m := _STEP.fullmatch(e.get("name", "")))), key=lambda s: s[0]
    )
    kernels = [e for e in events if e.get("cat") == "kernel"]
    per_step = []
    for number, step in steps:
        start, end = float(step["ts"]), float(step["ts"]) + float(step["dur"])
        inside = [
            (max(start, float(k["ts"])), min(end, float(k["ts"]) + float(k["dur"])))
            for k in kernels
            if float(k["ts"]) < end and float(k["ts"]) + float(k["dur"]) > start
        ]
        busy = total(inside)
        per_step.append(
            dict(
                step=number,
                wall_ms=round((end - start) / 1e3, 3),
                kernels=len(inside),
                gpu_busy_ms=round(busy / 1e3, 3),
                gpu_busy_share=round(busy / (end - start), 3),
            )
        )
    by_kernel: dict[str, list[float]] = collections.defaultdict(list)
    for k in kernels:
        by_kernel[k.get("name", "?")].append(float(k["dur"]))
    by_host_op: dict[str, list[float]] = collections.defaultdict(list)
    waits: dict[str, list[float]] = collections.defaultdict(list)
    for e in events:
        name = e.get("name", "")
        if e.get("cat") == "cpu_op" and not _STEP.fullmatch(name):
            by_host_op[name].append(float(e["dur"]))
        elif e.get("cat") == "cuda_runtime" and name in HOST_WAITS:
            waits[name].append(float(e["dur"]))
    return dict(
        steps=per_step,
        top_kernels=_top(by_kernel, top),
        top_host_ops=_top(by_host_op, top),
        host_waits=_top(waits, len(HOST_WAITS)),
    )


def summarize_file(path: str | Path, top: int = 10) -> dict[str, Any]:
    """:func:`summarize` of a trace file."""
    return summarize(json.loads(Path(path).read_text()), top)


def format_summary(summary: dict[str, Any], top: int = 6) -> Iterable[str]:
    """Lines for a log or a page."""
    for s in summary["steps"]:
        yield (
            f"step {s['step']}: {s['wall_ms']:.1f} ms wall, {s['kernels']} kernels, GPU busy "
            f"{s['gpu_busy_ms']:.1f} ms ({100 * s['gpu_busy_share']:.0f}%)"
        )
    for title, key in (("kernels", "top_kernels"), ("host ops", "top_host_ops"), ("host waits", "host_waits")):
        for item in summary[key][:top]:
            yield f"  {title}: {item['total_ms']:.1f} ms in {item['calls']} calls  {item['name']}"
