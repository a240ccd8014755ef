"""Host operations per layer and micro-batch at EP=1 and in the emulated EP=16 world, counted on a CPU.

Writes ``docs/benchmarks/ep_host_ops_results.json`` with ``--publish`` (see
``megatron.bridge.perf.benchmarks.host_ops`` for the cases and why a count says more than a CPU time):

    uv run python scripts/performance/ep_host_ops.py --out runs/ep_host_ops --publish
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
from pathlib import Path

from megatron.bridge.perf.benchmarks import host_ops
from megatron.bridge.perf.benchmarks.benchmark_jobs import git_commit, portable_command

REPO = Path(__file__).resolve().parents[2]
RESULTS_JSON = REPO / "docs" / "benchmarks" / "ep_host_ops_results.json"
HARNESS = REPO / "scripts" / "performance" / "run_script.py"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/ep_host_ops"))
    p.add_argument("--arms", default=",".join(host_ops.ARMS), help="ep1 (always run), off, on, off_gather, on_gather")
    p.add_argument("--publish", action="store_true", help=f"also write {RESULTS_JSON.relative_to(REPO)}")
    p.add_argument("--job-timeout", type=float, default=900.0)
    p.add_argument(
        "--code-root",
        type=Path,
        default=REPO,
        help="run the harness of this checkout (its src/ and scripts/), to count another commit",
    )
    p.add_argument("--commit", default=None, help="the commit of --code-root where it is an export, not a checkout")
    p.add_argument(
        "--compare",
        type=Path,
        default=None,
        metavar="RESULTS_JSON",
        help="a results.json made with --code-root at another commit (a change tried, or before one): kept "
        "beside these rows",
    )
    p.add_argument("--compare-note", default="", help="what --compare's commit changed, in a line")
    args = p.parse_args(argv)
    known = ", ".join(host_ops.ARMS)
    problems = [f"--arms: {arm!r} is not one of {known}" for arm in _arms(args) if arm not in host_ops.ARMS]
    if not (args.code_root / HARNESS.relative_to(REPO)).is_file():
        problems.append(f"--code-root: {args.code_root} holds no {HARNESS.relative_to(REPO)}; give a checkout's root")
    if args.compare is not None and not args.compare.is_file():
        problems.append(f"--compare: {args.compare} is not a file; give an earlier run's results.json")
    if problems:
        p.error("; ".join(problems))
    return args


def _arms(args: argparse.Namespace) -> list[str]:
    """``ep1`` first (the reference), then the other arms asked for."""
    return ["ep1", *(a for a in args.arms.split(",") if a and a != "ep1")]


PORTABLE = {
    "--out": "runs/ep_host_ops",
    "--compare": "runs/ep_host_ops_compared/results.json",
    "--code-root": "<checkout of --commit>",
}
"""What a committed result writes for this machine's folders."""


def run_case(case: host_ops.HostOpsCase, out: Path, timeout: float, code_root: Path) -> collections.Counter[str]:
    """Train ``case`` through the harness of ``code_root`` and count its profiled step's operator calls."""
    log = out / f"{case.arm}.log"
    harness = code_root / HARNESS.relative_to(REPO)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code_root / "src"), os.environ.get("PYTHONPATH", "")])}
    with open(log, "w") as fh:
        code = subprocess.run(
            [sys.executable, str(harness), *case.argv(out / "cases")],
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            timeout=timeout,
        ).returncode
    if code != 0:
        raise SystemExit(f"case {case.arm} failed (exit {code}); its log: {log}")
    return host_ops.host_op_counts(host_ops.read_trace(out / "cases" / case.arm))


def main(argv: list[str]) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cases = host_ops.arms_of(_arms(args))
    counts = {case.arm: run_case(case, args.out, args.job_timeout, args.code_root) for case in cases}
    results = dict(
        question="how many more operator calls does the host make a layer and micro-batch at EP=16 than at EP=1?",
        command=portable_command(["uv", "run", "python", "scripts/performance/ep_host_ops.py", *argv], PORTABLE),
        commit=args.commit or git_commit(args.code_root),
        device="CPU (operator counts do not depend on the machine; no time is reported)",
        shape=host_ops.shape(),
        cases={case.arm: case.argv(Path("runs/ep_host_ops/cases")) for case in cases},
        rows=host_ops.compare(counts),
    )
    if args.compare is not None:
        other = json.loads(args.compare.read_text())
        results["compared"] = {"note": args.compare_note} | {key: other[key] for key in ("commit", "rows")}
    text = json.dumps(results, indent=1) + "\n"
    (args.out / "results.json").write_text(text)
    if args.publish:
        RESULTS_JSON.write_text(text)
    for row in results["rows"]:
        print(
            f"{row['arm']:4s} {row['host_ops_per_layer_microbatch']:8.1f} host ops a layer and micro-batch",
            f"({row['vs_ep1']}x ep1)",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
