"""Command line of ``scripts/performance/analyze_overlap.py`` (kept importable for tests)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Optional, Sequence

from megatron.bridge.perf.overlap_analysis import DEFAULT_THRESHOLD, analyze_trace


def _run_facts_near(trace: Path) -> tuple[Optional[int], Optional[bool]]:
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="analyze_overlap.py", description=__doc__)
    p.add_argument("traces", nargs="+", type=Path, help="Chrome trace files (.json or .json.gz)")
    p.add_argument("--ep", type=int, default=None, help="expert-parallel size (default: from summary.json nearby)")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                   help="exposed share of the step above which EP overlap is recommended")
    p.add_argument("--no-sendrecv", dest="sendrecv", action="store_false",
                   help="do not count NCCL SendRecv kernels as all-to-all (use with PP>1)")
    cpu = p.add_mutually_exclusive_group()
    cpu.add_argument("--cpu-ops", dest="cpu_ops", action="store_const", const=True, default=None,
                     help="always count CPU-side all-to-all ops (gloo) as communication")
    cpu.add_argument("--no-cpu-ops", dest="cpu_ops", action="store_const", const=False,
                     help="never count CPU-side all-to-all ops")
    p.add_argument("--json", type=Path, default=None, help="also write the numbers as JSON")
    args = p.parse_args(argv)

    results = {}
    for trace in args.traces:
        if not trace.is_file():
            p.error(f"no such trace file: {trace}")
        summary_ep, overlap_on = _run_facts_near(trace)
        analysis = analyze_trace(
            trace,
            expert_parallel_size=args.ep or summary_ep,
            threshold=args.threshold,
            include_sendrecv=args.sendrecv,
            include_cpu_ops=args.cpu_ops,
        )
        analysis = dataclasses.replace(analysis, ep_overlap_active=overlap_on)
        print(f"== {trace}")
        print(analysis.format())
        results[str(trace)] = analysis.to_dict()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0
