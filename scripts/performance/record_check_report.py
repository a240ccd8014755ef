"""Turn a GPU check program's output into a result record under ``docs/benchmarks/results/``.

The check programs in ``tests/gpu_checks/`` print one ``REPORT {json}`` line (rank 0). A record
keeps that report with what is needed to read and repeat it: the exact command, the setting it ran
in (machine, ranks, environment) and the code it ran on::

    python scripts/performance/record_check_report.py --log run.log --out docs/benchmarks/results/x/y.json \\
        --command "torchrun --nproc-per-node 2 tests/gpu_checks/vdev_offsets.py --backend gloo" \\
        --setting "one H200, two ranks under CUDA MPS" --tree 1cd3782

The last ``REPORT`` line of the log is the one recorded (a log holds one run).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPORT_PREFIX = "REPORT "


def last_report(log_text: str) -> dict:
    """The JSON of the log's last ``REPORT`` line; ``ValueError`` naming the problem if there is none."""
    lines = [line for line in log_text.splitlines() if line.startswith(REPORT_PREFIX)]
    if not lines:
        raise ValueError("no line starting with 'REPORT ' in the log: the check program did not finish")
    return json.loads(lines[-1][len(REPORT_PREFIX) :])


def record(log_text: str, command: str, setting: str, tree: str) -> dict:
    return {"command": command, "setting": setting, "tree": tree, "report": last_report(log_text)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log", type=Path, required=True, help="the check program's output")
    p.add_argument("--out", type=Path, required=True, help="the record to write (JSON)")
    p.add_argument("--command", required=True, help="the exact command that produced the log")
    p.add_argument("--setting", required=True, help="machine, ranks and environment it ran in")
    p.add_argument("--tree", required=True, help="the commit (and any difference from it) it ran on")
    args = p.parse_args(argv)
    try:
        rec = record(args.log.read_text(), args.command, args.setting, args.tree)
    except ValueError as exc:
        print(f"{args.log}: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rec, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
