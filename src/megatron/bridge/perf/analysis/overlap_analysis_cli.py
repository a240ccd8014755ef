"""Command line of ``scripts/performance/analyze_overlap.py`` (kept importable for tests).

Every file named is analysed; one that is missing, unreadable or not a torch profiler trace is
listed with its reason after the others' reports (exit 2), never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from megatron.bridge.perf.analysis.overlap_analysis import DEFAULT_THRESHOLD, OverlapAnalysis, TraceError, analyze_trace


def _run_facts_near(trace: Path) -> tuple[int | None, bool | None]:
    """EP size and whether EP overlap was on, from the run's ``summary.json`` (in the trace's
    directory or up to three levels above it: the run's log dir); ``None`` where unknown."""
    for folder in [trace.parent, *trace.parents][:4]:
        summary = folder / "summary.json"
        if not summary.is_file():
            continue
        try:
            data = json.loads(summary.read_text())
        except (OSError, ValueError):
            return None, None
        ep = (data.get("parallel_layout") or {}).get("ep")
        feature = ((data.get("overlap_report") or {}).get("features") or {}).get("moe_ep_overlap") or {}
        active = feature.get("active")
        return (int(ep) if ep is not None else None), (bool(active) if active is not None else None)
    return None, None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="analyze_overlap.py", description=__doc__)
    p.add_argument("traces", nargs="+", type=Path, help="Chrome trace files (.json or .json.gz)")
    p.add_argument("--ep", type=int, default=None, help="expert-parallel size (default: from summary.json nearby)")
    p.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help="exposed share of the step above which EP overlap is recommended",
    )
    p.add_argument(
        "--no-sendrecv",
        dest="sendrecv",
        action="store_false",
        help="do not count NCCL SendRecv kernels as all-to-all (use with PP>1)",
    )
    cpu = p.add_mutually_exclusive_group()
    cpu.add_argument(
        "--cpu-ops",
        dest="cpu_ops",
        action="store_const",
        const=True,
        default=None,
        help="always count CPU-side all-to-all ops (gloo) as communication",
    )
    cpu.add_argument(
        "--no-cpu-ops", dest="cpu_ops", action="store_const", const=False, help="never count CPU-side all-to-all ops"
    )
    p.add_argument("--json", type=Path, default=None, help="also write the numbers as JSON")
    args = p.parse_args(argv)

    results, problems = {}, []
    for trace in args.traces:
        try:
            analysis = _analyze(trace, args)
        except (TraceError, OSError) as exc:
            problems.append(f"  - {trace}: {_reason(exc)}")
            continue
        print(f"== {trace}")
        print(analysis.format())
        results[str(trace)] = analysis.to_dict()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if problems:
        print(f"{p.prog}: error: {len(problems)} file(s) not analysed:\n" + "\n".join(problems), file=sys.stderr)
        return 2
    return 0


def _analyze(trace: Path, args: Any) -> OverlapAnalysis:
    """One trace's analysis with the facts of its run (``summary.json`` nearby)."""
    if not trace.is_file():
        raise TraceError("no such file" if not trace.exists() else "not a file")
    summary_ep, overlap_on = _run_facts_near(trace)
    analysis = analyze_trace(
        trace,
        expert_parallel_size=args.ep or summary_ep,
        threshold=args.threshold,
        include_sendrecv=args.sendrecv,
        include_cpu_ops=args.cpu_ops,
    )
    return dataclasses.replace(analysis, ep_overlap_active=overlap_on)


def _reason(exc: Exception) -> str:
    """A refusal's reason in one line (an ``OSError`` as its message, without the errno tuple)."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)
