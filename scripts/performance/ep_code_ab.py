"""Is a code change faster? Two checkouts of the emulation benchmark, interleaved in one call.

Runs ``scripts/performance/ep_emulation_benchmark.py`` from checkout A (``--root``, this one by
default) and checkout B (``--other-root``: another checkout, or an export of a commit's ``src/`` and
``scripts/``), one repeat each at a time, A B then B A, with the benchmark arguments after ``--``;
writes every run's ``results.json`` and log, and ``ab.json`` (the ratios, repeat by repeat) under ``--out``
(see ``megatron.bridge.perf.benchmarks.code_ab``):

    uv run python scripts/performance/ep_code_ab.py --other-root ../gather --other-label gather \\
        --repeats 2 --out runs/code_ab -- --networks h100_ib400 --dispatchers alltoall --arms free,off,on \\
        --profile-arms '' --steps 8 --window-start 4 --gpu h100
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from megatron.bridge.perf.benchmarks import code_ab
from megatron.bridge.perf.benchmarks.benchmark_jobs import git_commit, portable_command, run_logged

REPO = Path(__file__).resolve().parents[2]


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    own, bench_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=REPO, help="checkout A (default: this one)")
    p.add_argument("--label", default="A", help="what checkout A is called in the results")
    p.add_argument("--commit", default=None, help="checkout A's commit, where it is an export")
    p.add_argument("--other-root", type=Path, required=True, help="checkout B")
    p.add_argument("--other-label", default="B", help="what checkout B is called in the results")
    p.add_argument("--other-commit", default=None, help="checkout B's commit, where it is an export")
    p.add_argument("--repeats", type=int, default=2, help="runs of each checkout (at least 2)")
    p.add_argument("--out", type=Path, default=Path("runs/code_ab"))
    p.add_argument("--run-timeout", type=float, default=1800.0, help="seconds one run may take")
    args = p.parse_args(own)
    roots = {args.label: args.root, args.other_label: args.other_root}
    found = code_ab.problems(roots, [args.label, args.other_label], args.repeats, bench_args)
    if found:
        p.error("; ".join(found))
    return args, bench_args


def run_one(root: Path, bench_args: list[str], out: Path, timeout: float) -> int:
    """One repeat of ``root``'s benchmark, with ``root/src`` first on the path, its output in
    ``<out>.log``; its exit status (at the time limit its whole process group is stopped)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root / "src"), os.environ.get("PYTHONPATH")]))}
    argv = [sys.executable, str(root / code_ab.BENCHMARK), *bench_args, "--repeats", "1", "--out", str(out)]
    return run_logged(argv, env, out.with_suffix(".log"), timeout)


def main(argv: list[str]) -> int:
    args, bench_args = parse(argv)
    labels = (args.label, args.other_label)
    roots = dict(zip(labels, (args.root, args.other_root)))
    commits = {
        args.label: args.commit or git_commit(args.root),
        args.other_label: args.other_commit or git_commit(args.other_root),
    }
    order = code_ab.interleaved_order(labels, args.repeats)
    runs: dict[tuple[int, str], list[dict]] = {}
    meta: dict = {}
    exits = {}
    args.out.mkdir(parents=True, exist_ok=True)
    for repeat, label in order:
        name = code_ab.run_name(label, repeat)
        print(f"run {name} ({roots[label]}), log {args.out / name}.log", flush=True)
        exits[name] = run_one(roots[label], bench_args, args.out / name, args.run_timeout)
        results = args.out / name / "results.json"
        if results.is_file():
            loaded = json.loads(results.read_text())
            runs[(repeat, label)] = loaded["rows"]
            meta = meta or {key: loaded.get(key) for key in ("device", "host", "networks", "modeled")}
    rows = code_ab.same_run_ratios(runs, labels)
    record = {
        "question": f"is {labels[1]} faster than {labels[0]}, arm by arm, with the two interleaved in one call?",
        "command": portable_command(
            ["uv", "run", "python", "scripts/performance/ep_code_ab.py", *argv],
            {"--out": "runs/code_ab", "--root": "CHECKOUT_A", "--other-root": "CHECKOUT_B"},
        ),
        "codes": {label: {"commit": commits[label]} for label in labels},
        "order": [code_ab.run_name(label, repeat) for repeat, label in order],
        "exit_status": exits,
        **meta,
        "rows": rows,
    }
    (args.out / "ab.json").write_text(json.dumps(record, indent=1) + "\n")
    print(code_ab.table(rows, labels))
    return 0 if rows and all(code == 0 for code in exits.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
