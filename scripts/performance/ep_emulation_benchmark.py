"""EP overlap in an emulated cluster, on one GPU: writes ``docs/benchmarks/ep_emulated_cluster_results.json``.

Qwen3-30B-A3B's layer shape at EP=8*nodes over ``nodes`` x 8 GPUs, one rank trained on this GPU in
an emulated world whose collectives take the time of a network model (modeled, not measured), with
EP overlap off and on, against EP=1 on the same GPU (see ``megatron.bridge.perf.benchmarks.emulation_benchmark``
for the arms and the hidden share).

    uv run python scripts/performance/ep_emulation_benchmark.py --out runs/ep_emulation --publish

``--out``/results.json is written again after each case is read, the timed cases of a job before its
profiled ones (reading a trace is the slow part), so a call cut short keeps the rows it finished
(``"complete": false``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from megatron.bridge.emulation.network import PRESETS
from megatron.bridge.perf.benchmarks import emulation_benchmark as bench
from megatron.bridge.perf.benchmarks.benchmark_jobs import (
    NOMINAL_PEAK_TFLOPS,
    SAFE_ENV,
    device_name,
    git_commit,
    host_facts,
    job_argv,
    matmul_ceiling_tflops,
    portable_command,
    run_logged,
    write_configs,
)

REPO = Path(__file__).resolve().parents[2]
RESULTS_JSON = REPO / "docs" / "benchmarks" / "ep_emulated_cluster_results.json"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/ep_emulation"))
    p.add_argument("--networks", default="h100_ib400,h200_ib400", help=f"comma-separated: {', '.join(PRESETS)}")
    p.add_argument("--dispatchers", default="alltoall,sorted", help=", ".join(bench.DISPATCHERS))
    p.add_argument("--arms", default=",".join(bench.ARMS))
    p.add_argument(
        "--profile-arms",
        default="ep1,free,off,on",
        help="arms that run once more with their last step profiled (its anatomy goes into the rows, and the "
        "window's steps before it count as one more repeat; '' for none)",
    )
    p.add_argument("--nodes", type=int, default=2, help="nodes of 8 GPUs (EP = 8 x nodes)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--micro-batches", type=int, default=bench.MICRO_BATCHES, help="micro-batches per rank a step")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--window-start", type=int, default=4)
    p.add_argument("--gpu", default="h200", help="the -g target the cases are validated for")
    p.add_argument("--job-timeout", type=float, default=540.0)
    p.add_argument("--publish", action="store_true", help=f"also write {RESULTS_JSON.relative_to(REPO)}")
    p.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        metavar="RESULTS_JSON",
        help="instead of running: merge the results.json of separate runs (their repeats side by side, "
        "hidden shares of the pooled means) into --out/results.json (and, with --publish, the docs)",
    )
    p.add_argument(
        "--ran-at",
        action="append",
        default=[],
        metavar="[FILE=]COMMIT",
        help="with --merge: the commit whose code the runs ran, or FILE=COMMIT for one run's (repeatable: "
        "runs made at different commits keep each its own)",
    )
    p.add_argument(
        "--note",
        action="append",
        default=[],
        help="with --merge: a line about how the runs were made, kept in the results (repeatable)",
    )
    p.add_argument(
        "--leave-out",
        action="append",
        default=[],
        metavar="FILE:DISPATCHER",
        help="with --merge: leave that run's rows of that dispatcher out (a run re-made later); "
        "said in the results' notes (repeatable)",
    )
    return p.parse_args(argv)


def commits_of_runs(ran_at: list[str], paths: list[Path]) -> list[str | None]:
    """Each run's commit from the ``--ran-at`` values: ``FILE=COMMIT`` for the run of that file name,
    a bare ``COMMIT`` for every other run (``None``: the rows keep the commit they recorded)."""
    default: str | None = None
    by_file: dict[str, str] = {}
    for item in ran_at:
        name, sep, commit = item.rpartition("=")
        if not sep:
            default = commit
        elif name not in {p.name for p in paths}:
            raise ValueError(
                f"--ran-at {item}: {name} is not one of the merged files; "
                "fix: name a file given to --merge (FILE=COMMIT), or give a bare COMMIT for every run"
            )
        else:
            by_file[name] = commit
    return [by_file.get(p.name, default) for p in paths]


def merge(args: argparse.Namespace) -> int:
    """Runs of the same benchmark made in separate calls, as one table: every repeat of every row."""
    runs = [json.loads(path.read_text()) for path in args.merge]
    left_out = {tuple(item.rsplit(":", 1)) for item in args.leave_out}
    tables = [
        [row for row in run["rows"] if (path.name, row["dispatcher"]) not in left_out]
        for path, run in zip(args.merge, runs)
    ]
    try:
        ran_at = commits_of_runs(args.ran_at, args.merge)
        table = bench.merge_rows(tables, ran_at, [run.get("device") for run in runs])
    except (bench.MixedDevicesError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    meta = {key: runs[0][key] for key in ("question", "modeled", "steps", "window_start")}
    meta["networks"] = {name: figures for run in runs for name, figures in run["networks"].items()}
    meta.update(
        commands=[portable_command(shlex.split(run["command"]), {"--out": "runs/ep_emulation"}) for run in runs],
        devices=sorted({run["device"] for run in runs}),
        matmul_ceiling_tflops=[run["matmul_ceiling_tflops"] for run in runs],
        nominal_peak_tflops=NOMINAL_PEAK_TFLOPS,
        ran_at=ran_at[0] if len(set(ran_at)) == 1 else dict(zip((p.name for p in args.merge), ran_at)),
        notes=args.note + [f"left out: {item}" for item in args.leave_out],
        merged_by=shlex.join(
            [
                "uv",
                "run",
                "python",
                "scripts/performance/ep_emulation_benchmark.py",
                "--merge",
                *(p.name for p in args.merge),
                *(f"--ran-at={item}" for item in args.ran_at),
                *(f"--leave-out={item}" for item in args.leave_out),
            ]
        ),
    )
    hosts = [run["host"] for run in runs if "host" in run]
    if hosts:
        meta["hosts"] = hosts
    meta["layers"] = sorted({bench.row_key(row)[1] for row in table})
    args.out.mkdir(parents=True, exist_ok=True)
    bench.write_results(args.out / "results.json", table, meta)
    if args.publish:
        bench.write_results(RESULTS_JSON, table, meta)
    print(json.dumps(table, indent=1))
    return 0


def run_job(name: str, cases: list[bench.Case], out: Path, timeout: float) -> dict[str, dict]:
    """Train ``cases`` in one process; the summary of every case that finished."""
    paths, env = write_configs([case.argv(out / "cases") for case in cases])
    log = out / f"{name}.log"
    code = run_logged(job_argv(1, out / f"{name}_torchrun", paths), {**os.environ, **SAFE_ENV, **env}, log, timeout)
    print(f"job {name}: exit {code}, log {log}", flush=True)
    found = {}
    for case in cases:
        summary = out / "cases" / case.name / "summary.json"
        if summary.is_file():
            found[case.name] = json.loads(summary.read_text())
    return found


def read_job(
    cases: list[bench.Case], summaries: dict[str, dict], out: Path, window_start: int
) -> Iterator[tuple[str, dict]]:
    """Each finished case's result, the timed cases first: reading a profiled case's trace is the slow
    part, so the rows a call has timed are written before it starts."""
    for case in sorted(cases, key=lambda c: c.profile):
        if case.name in summaries:
            yield case.name, bench.case_result(case, summaries[case.name], window_start, out / "cases" / case.name)


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.merge:
        return merge(args)
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = bench.plan(
        args.networks.split(","),
        args.dispatchers.split(","),
        args.repeats,
        args.layers,
        args.nodes,
        args.steps,
        args.gpu,
        args.arms.split(","),
        [a for a in args.profile_arms.split(",") if a],
        args.micro_batches,
    )
    cases = [case for cases in jobs.values() for case in cases]
    meta = {
        "question": "how much of the modeled EP communication does EP overlap hide at EP=8 x nodes?",
        "command": shlex.join(["uv", "run", "python", "scripts/performance/ep_emulation_benchmark.py", *argv]),
        "device": device_name(),
        "host": host_facts(),
        "matmul_ceiling_tflops": matmul_ceiling_tflops(),
        "nominal_peak_tflops": NOMINAL_PEAK_TFLOPS,
        "modeled": "emulated rows: communication times are modeled by the named network, not measured",
        "networks": {n: vars(PRESETS[n]) | {"source": PRESETS[n].source} for n in args.networks.split(",")},
        "layers": args.layers,
        "steps": args.steps,
        "window_start": args.window_start,
    }
    results: dict[str, dict] = {}
    commit, started = git_commit(REPO), time.time()

    def write(complete: bool, publish: bool = False) -> list[dict]:
        """results.json as far as the call has come (``complete``: every timed case finished)."""
        table = bench.rows(cases, results, commit, args.nodes, meta["device"])
        run_meta = {**meta, "wall_s": time.time() - started, "complete": complete}
        bench.write_results(args.out / "results.json", table, run_meta)
        if publish:
            bench.write_results(RESULTS_JSON, table, run_meta)
        return table

    for name, job_cases in jobs.items():
        summaries = run_job(name, job_cases, args.out, args.job_timeout)
        for case_name, result in read_job(job_cases, summaries, args.out, args.window_start):
            results[case_name] = result
            write(complete=False)
    complete = all(case.name in results for case in cases if not case.profile)
    print(json.dumps(write(complete, publish=args.publish), indent=1))
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
