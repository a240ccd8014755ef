"""How much MoE dispatch/combine communication a profiled step hides under compute.

Input: a torch profiler Chrome trace (``prof.export_chrome_trace`` / ``tensorboard_trace_handler``).
From the *intervals* of the events (never summed kernel durations, which double-count concurrent
kernels) it measures

* ``comm``: the union of dispatch/combine intervals (the all-to-all of the token dispatcher);
* ``hidden``: the part of ``comm`` that intersects the union of compute kernels running on a
  *different* stream (work on the same stream cannot run concurrently with it);
* ``exposed = comm - hidden``, also as a share of the profiled step time.

What counts as dispatch/combine:

* NCCL all-to-all kernels (``AllToAll``/``alltoall``/``all_to_all``) and NCCL ``SendRecv`` kernels
  (NCCL implements ``all_to_all_single`` as grouped send/recv). With PP>1 pipeline p2p also uses
  SendRecv; pass ``include_sendrecv=False`` there;
* NVSHMEM all-to-all kernels (torch's ``allToAllV``; the emulated world's
  ``emulated_nvshmem_all_to_all``); other NVSHMEM kernels are other communication;
* DeepEP (``deep_ep``) and HybridEP (``hybrid_ep``/``hybridep``) dispatch/combine/notify kernels;
* CPU-side all-to-all ops (``c10d::alltoall*``, ``gloo:all_to_all``, ``record_param_comms`` with an
  all-to-all collective name), by default only when the trace has no dispatch/combine kernels. gloo (the CPU
  smoke mode, and two ranks sharing one GPU) runs collectives on CPU threads: they never appear as GPU kernels,
  only as CPU ops (plus device<->host copies). The CPU op's wall interval is then the communication interval; it
  is compared with GPU compute kernels on the same clock.

Other NCCL collectives (all-reduce, reduce-scatter, all-gather: gradient/parameter traffic) are
neither dispatch/combine nor compute. Memcpy/memset are not compute.

A trace without any GPU kernel comes from a CPU run (CPU smoke mode): its intervals are measured as
any other, but its timings rank nothing (the compute and gloo's all-to-all share a few CPU cores
with whatever else runs on the host), so its decision says that and recommends nothing.

A file that is not a torch profiler trace (not JSON, not gzip, no event list) raises
:class:`TraceError`, which says what was found.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

Interval = tuple[float, float]

_NCCL = re.compile(r"nccl", re.I)
_A2A = re.compile(r"all_?to_?all|alltoall", re.I)
_SENDRECV = re.compile(r"sendrecv", re.I)
_EP_LIB = re.compile(r"deep_?ep|hybrid_?ep", re.I)
_NVSHMEM = re.compile(r"nvshmem|allToAllV", re.I)
_EP_KERNEL = re.compile(r"dispatch|combine|notify", re.I)
_CPU_A2A = re.compile(r"^(c10d::alltoall|gloo:all_to_all|nccl:all_to_all|record_param_comms)", re.I)
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_KERNEL_CATS = {"kernel"}
_CPU_CATS = {"cpu_op", "user_annotation", "python_function"}

DEFAULT_THRESHOLD = 0.05
"""Exposed dispatch/combine share of the step above which EP overlap is recommended."""


# ----------------------------------------------------------------------------- interval maths
def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint union of half-open intervals (empty ones dropped)."""
    merged: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def total(intervals: Iterable[Interval]) -> float:
    """Length of the union of ``intervals``."""
    return sum(e - s for s, e in union(intervals))


def intersect(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """Intersection of two interval sets (each first merged), as disjoint intervals."""
    ua, ub = union(a), union(b)
    out: list[Interval] = []
    i = j = 0
    while i < len(ua) and j < len(ub):
        start, end = max(ua[i][0], ub[j][0]), min(ua[i][1], ub[j][1])
        if start < end:
            out.append((start, end))
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return out


class Coverage:
    """The union of some intervals, kept sorted, that answers which part of one interval it covers by
    bisection. A profiled step of a deep model holds thousands of exchanges and hundreds of thousands of
    kernels: asking :func:`intersect` once per event merges the whole set each time (quadratic), this
    finds the few intervals that can meet it."""

    def __init__(self, intervals: Iterable[Interval]) -> None:
        self.intervals = union(intervals)
        self._starts = [start for start, _ in self.intervals]

    def clip(self, start: float, end: float) -> list[Interval]:
        """The parts of ``[start, end)`` inside the set, as ``intersect([(start, end)], intervals)`` gives them."""
        parts: list[Interval] = []
        index = max(0, bisect.bisect_right(self._starts, start) - 1)
        while index < len(self.intervals) and self.intervals[index][0] < end:
            low, high = max(start, self.intervals[index][0]), min(end, self.intervals[index][1])
            if low < high:
                parts.append((low, high))
            index += 1
        return parts

    def covered(self, start: float, end: float) -> float:
        """How much of ``[start, end)`` the set covers."""
        return sum(high - low for low, high in self.clip(start, end))


# ----------------------------------------------------------------------------- classification
def classify(name: str, category: str, args: dict | None = None, *, include_sendrecv: bool = True) -> str:
    """``"a2a"`` (dispatch/combine kernel), ``"a2a_cpu"`` (CPU-side all-to-all op),
    ``"other_comm"``, ``"compute"`` or ``"ignore"``."""
    if category in _CPU_CATS:
        if _CPU_A2A.match(name):
            label = str((args or {}).get("Collective name", "")) if name.startswith("record_param_comms") else name
            if _A2A.search(label):
                return "a2a_cpu"
        return "ignore"
    if category not in _KERNEL_CATS:
        return "ignore"  # memcpy, memset, runtime calls, flows
    if _EP_LIB.search(name):
        return "a2a" if _EP_KERNEL.search(name) else "other_comm"
    if _NVSHMEM.search(name):
        return "a2a" if _A2A.search(name) else "other_comm"
    if _NCCL.search(name):
        if _A2A.search(name) or (include_sendrecv and _SENDRECV.search(name)):
            return "a2a"
        return "other_comm"
    return "compute"


@dataclass(frozen=True)
class Event:
    """One trace interval (microseconds) on a stream (GPU) or thread (CPU, ``"cpu:<tid>"``)."""

    name: str
    kind: str
    start: float
    end: float
    stream: str


class TraceError(ValueError):
    """The file is not a torch profiler Chrome trace; the message says why."""


def load_trace(path: str | Path) -> dict[str, Any]:
    """Read a Chrome trace (``.json`` or ``.json.gz``); :class:`TraceError` when the file is not one
    (an ``OSError`` when it cannot be read at all)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            trace = json.load(fh)
    except (gzip.BadGzipFile, EOFError) as exc:
        raise TraceError(f"not a gzip-compressed trace ({exc})") from None
    except UnicodeDecodeError:
        raise TraceError("not a trace: the file is not UTF-8 text (a binary file?)") from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"not a trace: not JSON ({exc})") from None
    _trace_events(trace)
    return trace


def _trace_events(trace: Any) -> list[dict[str, Any]]:
    """The event list of a Chrome trace (a ``{"traceEvents": [...]}`` object or a bare list of event
    objects); :class:`TraceError` for anything else."""
    raw = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(raw, list):
        raise TraceError("not a trace: JSON without a traceEvents list (is it a torch profiler export?)")
    if not all(isinstance(ev, dict) for ev in raw):
        raise TraceError("not a trace: its traceEvents are not all JSON objects")
    return raw


def gpu_kernel_count(trace: dict[str, Any]) -> int:
    """GPU kernels in the trace: none means a CPU run, whose timings rank nothing."""
    return sum(1 for ev in _trace_events(trace) if ev.get("cat") in _KERNEL_CATS)


def _events(
    trace: dict[str, Any], *, include_sendrecv: bool, include_cpu_ops: bool | None
) -> tuple[list[Event], list[tuple[int, float, float]]]:
    """Classified events and ProfilerStep spans ``(step number, start, end)``. CPU all-to-all ops count as
    dispatch/combine when ``include_cpu_ops`` is true, or (``None``) when the trace has no dispatch/combine kernels."""
    events: list[Event] = []
    steps: list[tuple[int, float, float]] = []
    for index, ev in enumerate(_trace_events(trace)):
        if ev.get("ph") != "X" or "dur" not in ev:
            continue
        name, cat = str(ev.get("name", "")), str(ev.get("cat", ""))
        try:
            start, end = float(ev["ts"]), float(ev["ts"]) + float(ev["dur"])
        except (KeyError, TypeError, ValueError):
            raise TraceError(f"not a trace: event {index} ({name[:80]!r}) has no numeric ts/dur") from None
        step_match = _STEP.match(name)
        if step_match:
            # torch marks each step on the CPU and again on every GPU stream it ran on
            # ("gpu_user_annotation"): spans of one step share its number.
            steps.append((int(step_match.group(1)), start, end))
            continue
        args = ev.get("args") or {}
        kind = classify(name, cat, args, include_sendrecv=include_sendrecv)
        if kind == "ignore":
            continue
        stream = (
            f"gpu:{args['stream']}"
            if "stream" in args
            else (f"cpu:{ev.get('tid')}" if cat in _CPU_CATS else f"tid:{ev.get('tid')}")
        )
        events.append(Event(name, kind, start, end, stream))
    if include_cpu_ops is None:
        include_cpu_ops = not any(e.kind == "a2a" for e in events)
    events = [
        Event(e.name, "a2a", e.start, e.end, e.stream) if e.kind == "a2a_cpu" else e
        for e in events
        if include_cpu_ops or e.kind != "a2a_cpu"
    ]
    return events, steps


# ----------------------------------------------------------------------------- the report
CPU_TRACE_DECISION = (
    "none: a CPU trace (no GPU kernels; CPU smoke mode) ranks nothing. Its compute and gloo's all-to-all share "
    "a few CPU cores with whatever else runs on the host, so neither whether EP overlap pays nor which "
    "dispatcher to use follows from it; profile the run on GPUs (-g <gpu>) to decide."
)
"""The decision for a trace without GPU kernels."""


@dataclass
class OverlapAnalysis:
    """Interval totals (milliseconds) and the quick decision."""

    step_time_ms: float
    num_steps: int
    comm_ms: float
    hidden_ms: float
    exposed_ms: float
    compute_ms: float
    other_comm_ms: float
    comm_kernels: int
    comm_names: list[str] = field(default_factory=list)
    expert_parallel_size: int | None = None
    threshold: float = DEFAULT_THRESHOLD
    ep_overlap_active: bool | None = None
    """Whether the profiled run had EP overlap on (from its ``summary.json``); ``None``: unknown."""
    gpu_kernels: int | None = None
    """GPU kernels in the trace (``0``: a CPU run, whose timings rank nothing); ``None``: not counted."""

    @property
    def hidden_fraction(self) -> float:
        """Share of dispatch/combine time hidden under compute."""
        return self.hidden_ms / self.comm_ms if self.comm_ms else 0.0

    @property
    def exposed_share(self) -> float:
        """Exposed dispatch/combine as a share of the profiled step time."""
        return self.exposed_ms / self.step_time_ms if self.step_time_ms else 0.0

    def decision(self) -> str:
        """A quick decision: overlap pays when EP>1 and the exposed all-to-all is a visible slice of the step."""
        ep = self.expert_parallel_size
        if ep is not None and ep <= 1:
            return "EP=1: tokens never leave the GPU, EP overlap has nothing to hide; leave it off."
        if self.gpu_kernels == 0:
            return CPU_TRACE_DECISION
        if self.comm_kernels == 0:
            return (
                "no dispatch/combine found in the trace (gloo collectives show only as CPU ops; "
                "profile a GPU run with NCCL/DeepEP/HybridEP or keep CPU ops in the analysis)."
            )
        share = f"{self.exposed_share:.1%}"
        ep_text = f"EP={ep}" if ep else "EP>1 (assumed; pass --ep)"
        if self.ep_overlap_active:
            hidden = f"{self.hidden_fraction:.0%}"
            if self.exposed_share > self.threshold:
                return (
                    f"{ep_text}, EP overlap is already on and hides {hidden} of dispatch/combine, but "
                    f"{share} of the step is still exposed (> {self.threshold:.0%}): try more "
                    "micro-batches or a faster dispatcher (flex: DeepEP/HybridEP), and compare "
                    "against overlap off with --sweep."
                )
            return (
                f"{ep_text}, EP overlap is on and hides {hidden} of dispatch/combine; only {share} of "
                "the step stays exposed: keep it on (confirm the gain against overlap off with --sweep)."
            )
        if self.exposed_share > self.threshold:
            return (
                f"{ep_text} and exposed dispatch/combine is {share} of the step (> {self.threshold:.0%}): "
                "turn EP overlap on (comm_overlap.overlap_moe_expert_parallel_comm=true, "
                "model.moe_shared_expert_overlap=false), then A/B it with --sweep."
            )
        return (
            f"{ep_text}, exposed dispatch/combine is only {share} of the step (<= {self.threshold:.0%}): "
            "EP overlap can gain little here; look elsewhere first."
        )

    def format(self) -> str:
        """A short human report."""
        rows = [
            ("profiled steps", f"{self.num_steps}"),
            ("step time (mean)", f"{self.step_time_ms / max(self.num_steps, 1):.3f} ms"),
            ("dispatch/combine (union)", f"{self.comm_ms:.3f} ms  ({self.comm_kernels} events)"),
            ("  hidden under compute", f"{self.hidden_ms:.3f} ms  ({self.hidden_fraction:.1%} of comm)"),
            ("  exposed", f"{self.exposed_ms:.3f} ms  ({self.exposed_share:.1%} of step time)"),
            ("compute kernels (union)", f"{self.compute_ms:.3f} ms"),
            ("other comm (union)", f"{self.other_comm_ms:.3f} ms"),
        ]
        if self.gpu_kernels == 0:
            rows.append(("device", "CPU only (no GPU kernels): these timings rank nothing"))
        width = max(len(k) for k, _ in rows)
        body = "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
        return f"EP dispatch/combine overlap analysis\n{body}\n  decision: {self.decision()}"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(hidden_fraction=self.hidden_fraction, exposed_share=self.exposed_share, decision=self.decision())
        return out


class ComputeBeside:
    """The compute kernels of a trace by stream, each stream's merged once: what of an interval on one
    stream the compute of the *other* streams covers (work on the same stream cannot run concurrently
    with it). A graph replay spreads its kernels over dozens of streams, so no union of everything
    else is built per stream; each interval asks every other stream by bisection."""

    def __init__(self, events: Sequence[Event]) -> None:
        by_stream: dict[str, list[Interval]] = {}
        for e in events:
            if e.kind == "compute":
                by_stream.setdefault(e.stream, []).append((e.start, e.end))
        self._streams = {stream: Coverage(intervals) for stream, intervals in by_stream.items()}

    def clip(self, stream: str, start: float, end: float) -> list[Interval]:
        """The parts of ``[start, end)`` on ``stream`` that compute on another stream covers."""
        return union(
            part for other, coverage in self._streams.items() if other != stream for part in coverage.clip(start, end)
        )

    def covered(self, stream: str, start: float, end: float) -> float:
        """How much of ``[start, end)`` on ``stream`` compute on another stream covers."""
        return total(self.clip(stream, start, end))


def hidden_intervals(events: Sequence[Event]) -> list[Interval]:
    """Dispatch/combine time covered by compute on a *different* stream than the comm event's."""
    beside = ComputeBeside(events)
    return union(part for e in events if e.kind == "a2a" for part in beside.clip(e.stream, e.start, e.end))


def analyze_events(
    events: Sequence[Event],
    steps: Sequence[tuple[int, float, float]] = (),
    *,
    expert_parallel_size: int | None = None,
    threshold: float = DEFAULT_THRESHOLD,
) -> OverlapAnalysis:
    """Measure comm/hidden/exposed; the step time is the ProfilerStep spans, else the event span.

    ``steps`` are ``(step number, start, end)``; a step marked on the CPU and on GPU streams
    counts once. Only events inside the profiled steps count when step markers exist.
    """
    step_union = union([(start, end) for _, start, end in steps])
    if step_union:
        inside = Coverage(step_union)
        events = [Event(e.name, e.kind, s, t, e.stream) for e in events for s, t in inside.clip(e.start, e.end)]
        step_time, num_steps = total(step_union), len({number for number, _, _ in steps})
    else:
        span = (min((e.start for e in events), default=0.0), max((e.end for e in events), default=0.0))
        step_time, num_steps = span[1] - span[0], 1
    by = lambda kind: [(e.start, e.end) for e in events if e.kind == kind]  # noqa: E731
    comm = total(by("a2a"))
    hidden = total(hidden_intervals(events))
    us = 1e-3
    return OverlapAnalysis(
        step_time_ms=step_time * us,
        num_steps=num_steps,
        comm_ms=comm * us,
        hidden_ms=hidden * us,
        exposed_ms=(comm - hidden) * us,
        compute_ms=total(by("compute")) * us,
        other_comm_ms=total(by("other_comm")) * us,
        comm_kernels=sum(e.kind == "a2a" for e in events),
        comm_names=sorted({e.name for e in events if e.kind == "a2a"})[:10],
        expert_parallel_size=expert_parallel_size,
        threshold=threshold,
    )


def analyze_trace(
    trace: dict[str, Any] | str | Path,
    *,
    expert_parallel_size: int | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    include_sendrecv: bool = True,
    include_cpu_ops: bool | None = None,
) -> OverlapAnalysis:
    """Analyse a Chrome trace (dict or path)."""
    if not isinstance(trace, dict):
        trace = load_trace(trace)
    events, steps = _events(trace, include_sendrecv=include_sendrecv, include_cpu_ops=include_cpu_ops)
    analysis = analyze_events(events, steps, expert_parallel_size=expert_parallel_size, threshold=threshold)
    analysis.gpu_kernels = gpu_kernel_count(trace)
    return analysis
