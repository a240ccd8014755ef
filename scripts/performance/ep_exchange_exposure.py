"""Which dispatch/combine exchanges of a profiled EP-overlap step stay exposed, by their place in
megatron-core's schedule (``megatron.bridge.perf.analysis.exchange_exposure``).

    uv run python scripts/performance/ep_exchange_exposure.py TRACE.json[.gz] --layers 4 --micro-batches 8 \\
        [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from megatron.bridge.perf.analysis.exchange_exposure import ExchangeCountMismatch, exchange_exposure
from megatron.bridge.perf.analysis.overlap_analysis import TraceError


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", type=Path, help="a torch profiler Chrome trace of a step with EP overlap on")
    p.add_argument("--layers", type=int, required=True, help="the run's transformer layers (all MoE)")
    p.add_argument("--micro-batches", type=int, required=True, help="the run's micro-batches per rank a step")
    p.add_argument("--json", type=Path, default=None, help="also write the split there")
    args = p.parse_args(argv)
    try:
        split = exchange_exposure(args.trace, args.layers, args.micro_batches)
    except (OSError, TraceError, ExchangeCountMismatch) as exc:
        print(f"error: {args.trace}: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(
        {"trace": args.trace.name, "layers": args.layers, "micro_batches": args.micro_batches, **split}, indent=1
    )
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
