"""Command line of ``scripts/performance/analyze_overlap.py`` (kept importable for tests)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional, Sequence

from megatron.bridge.perf.overlap_analysis import DEFAULT_THRESHOLD, analyze_trace


def _expert_parallel_size_near(trace: Path) -> Optional[int]:
    """EP size from a ``summary.json`` in the trace's directory or its parents (the run's log dir)."""
    for folder in [trace.parent, *trace.parents][:4]:
        summary = folder / "summary.json"
        if summary.is_file():
            try:
                data = json.loads(summary.read_text())
            except (OSError, ValueError):
                return None
            layout = data.get("layout") or {}
            for key in ("expert_model_parallel_size", "ep", "EP"):
                if key in layout:
                    return int(layout[key])
    return None


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
        analysis = analyze_trace(
            trace,
            expert_parallel_size=args.ep or _expert_parallel_size_near(trace),
            threshold=args.threshold,
            include_sendrecv=args.sendrecv,
            include_cpu_ops=args.cpu_ops,
        )
        print(f"== {trace}")
        print(analysis.format())
        results[str(trace)] = analysis.to_dict()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0
