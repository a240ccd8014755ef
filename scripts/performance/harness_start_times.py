#!/usr/bin/env python
"""How long the harness takes to answer ``--help``, a mistyped flag, an unknown recipe and the
README's ``--dryrun``, for one or more source trees compared in one run (interleaved, repeated).

Usage (compare a commit with the working tree; ``git worktree add /tmp/base <commit>`` first):

    uv run python scripts/performance/harness_start_times.py --tree base=/tmp/base --tree new=. \\
        --repeats 5 --out runs/harness_start_times.json

Prints a table (median and minimum wall time, median CPU time) and, with ``--imports``, where the
dry run's import time goes; ``--out`` also writes the raw samples as JSON. The logic lives in
``megatron.bridge.perf.benchmarks.start_times``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from megatron.bridge.perf.benchmarks.start_times import COMMANDS, import_breakdown, markdown, measure


def main() -> int:
    p = argparse.ArgumentParser(
        prog="harness_start_times.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--tree",
        action="append",
        required=True,
        metavar="LABEL=DIR",
        help="a checkout to time (its scripts/ and src/); give two or more to compare",
    )
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--commands", default=",".join(COMMANDS), help=f"which of {', '.join(COMMANDS)}")
    p.add_argument(
        "--no-references",
        dest="references",
        action="store_false",
        help="leave out the interpreter, torch and megatron-core import times",
    )
    p.add_argument("--imports", action="store_true", help="also break the dry run's import time down by package")
    p.add_argument("--out", type=Path, default=None, help="write the samples and medians as JSON")
    args = p.parse_args()
    trees = {}
    for item in args.tree:
        label, sep, folder = item.partition("=")
        if not sep or not (Path(folder) / "scripts" / "performance" / "run_script.py").is_file():
            p.error(f"--tree expects LABEL=DIR of a checkout, got {item!r}")
        trees[label] = Path(folder).resolve()
    commands = [name for name in args.commands.split(",") if name]
    unknown = set(commands) - set(COMMANDS)
    if unknown or args.repeats < 1:
        p.error(f"unknown --commands {sorted(unknown)}" if unknown else "--repeats must be >= 1")
    results = measure(trees, args.repeats, commands, args.references)
    breakdown = {label: import_breakdown(tree) for label, tree in trees.items()} if args.imports else None
    print(markdown(results, breakdown))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        rows = {
            name: {label: {**s.row(), "wall_s": s.wall_s, "cpu_s": s.cpu_s} for label, s in by_tree.items()}
            for name, by_tree in results.items()
        }
        args.out.write_text(
            json.dumps(
                {
                    "trees": {k: str(v) for k, v in trees.items()},
                    "repeats": args.repeats,
                    "results": rows,
                    "imports_s": breakdown,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
