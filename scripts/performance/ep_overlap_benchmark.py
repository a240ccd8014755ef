"""EP overlap A/B on one host of two GPUs: the whole table of ``docs/benchmarks/ep_overlap.md`` in one run.

Every case is built exactly as ``run_script.py`` builds it (the same flags and dotted overrides,
the same validation) and trained by ``pretrain()`` with the optimizer. Cases that share a launch
(the same GPUs and transport) run one after another inside one ``torchrun`` job, so the start-up
cost is paid once per job, not per case:

* ``ep1``: EP=1 on one GPU, the compute-only reference (same per-GPU work: 8 micro-batches);
* ``nvlink``: EP=2 across both GPUs, NCCL and NVSHMEM over NVLink;
* ``host_staged``: EP=2 with ``NCCL_P2P_DISABLE=1`` (NCCL stages through host memory: a stand-in
  for slower inter-node links).

``--cuda-graph full_iteration`` captures each case's forward+backward as one CUDA graph after two
eager steps (``docs/training/cuda-graphs.md``; its rules refuse what cannot be captured, before
anything is launched: at EP=2 everything but the sorted dispatcher over NVSHMEM, so use it with
``--ep-dispatch sorted --transports nvlink``; the host-staged cases run over NCCL and are refused).
``--ep-dispatch`` picks the EP=2 token dispatch: ``auto`` (the product default: megatron-core's
alltoall dispatcher) or ``sorted`` (the torch-native sorted dispatcher: NVSHMEM over NVLink,
``model.torch_native_ep_transport=nvshmem``; in the host-staged cases over NCCL, ``nccl``, because
NVSHMEM ignores ``NCCL_P2P_DISABLE`` and would not be slowed down).

Within a job the cases are interleaved (for each repeat: MBS 2 off, on, then MBS 1 off, on; the
larger micro-batch first so the token buffers are sized once). The steady state is iterations
``--window-start``..``--steps`` of each case. Outputs: ``<out>/results.json`` (rewritten after every
job, ``"complete": false`` until the last one has run, so a stopped benchmark keeps what finished)
plus, with ``--publish``, ``docs/benchmarks/ep_overlap_results.json`` and the generated section of
``docs/benchmarks/ep_overlap.md``.

    uv run python scripts/performance/ep_overlap_benchmark.py --out runs/ep_overlap --publish
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from megatron.bridge.perf.benchmarks import benchmark_jobs
from megatron.bridge.perf.benchmarks.benchmark_jobs import (
    JOB_TIMED_OUT,
    NOMINAL_PEAK_TFLOPS,
    SAFE_ENV,
    job_argv,
    matmul_ceiling_tflops,
    run_logged,
)
from megatron.bridge.perf.harness.results import argv_without

REPO = Path(__file__).resolve().parents[2]

RESULTS_JSON = REPO / "docs" / "benchmarks" / "ep_overlap_results.json"
RESULTS_MD = REPO / "docs" / "benchmarks" / "ep_overlap.md"
BEGIN, END = "<!-- generated: begin -->", "<!-- generated: end -->"
TRANSPORT_ENV = {"ep1": {}, "nvlink": {}, "host_staged": {"NCCL_P2P_DISABLE": "1"}}
# EP=2 dispatch -> transport -> extra overrides
DISPATCH_OVERRIDES = {
    "auto": {"ep1": [], "nvlink": [], "host_staged": []},
    "sorted": {
        "ep1": [],
        "nvlink": ["model.torch_native_dispatcher=sorted", "model.torch_native_ep_transport=nvshmem"],
        "host_staged": ["model.torch_native_dispatcher=sorted", "model.torch_native_ep_transport=nccl"],
    },
}

# --cuda-graph -> extra overrides: capture in step 3, before the steady window (from step 4)
GRAPH_OVERRIDES = {"none": [], "full_iteration": ["model.cuda_graph_warmup_steps=2"]}


@dataclass
class Case:
    """One training run: a transport (job), a micro-batch size, overlap on/off, a repeat index."""

    transport: str
    mbs: int
    overlap: bool
    repeat: int
    log_dir: Path = field(default=Path())
    env: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        kind = "ep1" if self.transport == "ep1" else f"{self.transport}_{'on' if self.overlap else 'off'}"
        return f"{kind}_mbs{self.mbs}_r{self.repeat}"


def harness_argv(case: Case, args: argparse.Namespace) -> list[str]:
    """The ``run_script.py`` command line of one case (what a user would type)."""
    ep = 1 if case.transport == "ep1" else 2
    micro_batches = 8
    argv = [
        "-m",
        "qwen",
        "-mr",
        "qwen3_30b_a3b",
        "--task",
        "pretrain",
        "-g",
        "h200",
        "-c",
        "bf16",
        "-ng",
        str(ep),
        "-ep",
        str(ep),
        "-mb",
        str(case.mbs),
        "-gb",
        str(case.mbs * micro_batches * ep),
        "-sl",
        "4096",
        "--max_steps",
        str(args.steps),
        "--cuda_graph_impl",
        args.cuda_graph,
        "--moe_flex_dispatcher_backend",
        "None",
        "--tokenizer_type",
        "NullTokenizer",
        "--moe_a2a_overlap",
        "true" if case.overlap else "false",
        "-l",
        str(case.log_dir),
        f"model.num_layers={args.layers}",
        "scheduler.lr_warmup_iters=2",
        f"logger.steady_state_window=[{args.window_start},{args.steps}]",
        *GRAPH_OVERRIDES[args.cuda_graph],
        *DISPATCH_OVERRIDES[args.ep_dispatch][case.transport],
        *args.override,
    ]
    return argv


def plan_cases(args: argparse.Namespace) -> dict[str, list[Case]]:
    """Cases per job, interleaved: for each repeat, the larger MBS first, overlap off then on."""
    mbs_list = sorted(args.mbs, reverse=True)
    jobs: dict[str, list[Case]] = {}
    for transport in ["ep1", *args.transports]:
        cases = []
        for repeat in range(args.repeats):
            for mbs in mbs_list:
                for overlap in (False,) if transport == "ep1" else (False, True):
                    case = Case(transport, mbs, overlap, repeat)
                    case.log_dir = args.out / case.name
                    cases.append(case)
        jobs[transport] = cases
    return jobs


def write_configs(cases: list[Case], args: argparse.Namespace) -> list[Path]:
    """Resolve and validate each case through the harness; returns the YAML paths."""
    paths, env = benchmark_jobs.write_configs(harness_argv(case, args) for case in cases)
    for case in cases:  # as the harness's sweeps: every run of a job gets what any run needs
        case.env = dict(env)  # (CUDA_DEVICE_MAX_CONNECTIONS=32 for EP overlap)
    return paths


def run_job(transport: str, cases: list[Case], args: argparse.Namespace) -> int:
    """One ``torchrun`` job that trains ``cases`` in order."""
    paths = write_configs(cases, args)
    argv = job_argv(1 if transport == "ep1" else 2, args.out / f"job_{transport}", paths)
    env = dict(os.environ)
    for case in cases:
        env.update(case.env)
    env.update(SAFE_ENV)
    env.update(TRANSPORT_ENV[transport])
    log = args.out / f"job_{transport}.log"
    print(f"== job {transport}: {len(cases)} runs, log {log}", flush=True)
    start = time.time()
    code = run_logged(argv, env, log, args.job_timeout)
    timed_out = " (--job-timeout reached; the runs that finished are kept)" if code == JOB_TIMED_OUT else ""
    print(f"   exit {code} after {time.time() - start:.0f} s{timed_out}", flush=True)
    return code


# ------------------------------------------------------------------------------ results


def load_case(case: Case) -> dict | None:
    path = case.log_dir / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else None


def case_stats(summary: dict) -> dict:
    window = summary["steady_state_window"]
    times = summary["step_times_s"][window[0] - 1 : window[1]]
    extra = summary.get("extra", {})

    def mean_of(key: str) -> float | None:
        values = extra.get(key, [])[window[0] - 1 : window[1]]
        return statistics.fmean(values) if values else None

    return dict(
        step_s=summary["steady_state_mean_s"],
        min_s=min(times),
        max_s=max(times),
        tflops_per_gpu=summary["tflops_per_gpu"],
        losses=summary["losses"],
        host_fwd_bwd_s=mean_of("host_fwd_bwd_s"),
        gpu_fwd_bwd_s=mean_of("gpu_fwd_bwd_s"),
        gpu_optimizer_s=mean_of("gpu_optimizer_s"),
        dispatch=summary.get("moe_token_dispatch"),
        window=window,
    )


def mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def rows(jobs: dict[str, list[Case]]) -> list[dict]:
    """One row per (EP=2 transport, MBS): EP=1 reference, overlap off and on, all repeats.

    Without EP=2 jobs (``--transports`` with no value: one GPU), one ``ep1`` row per MBS.
    """
    stats = {case.name: case_stats(s) for cases in jobs.values() for case in cases if (s := load_case(case))}

    def runs(transport: str, mbs: int, overlap: bool) -> list[dict]:
        return [
            stats[c.name] for c in jobs.get(transport, []) if c.mbs == mbs and c.overlap == overlap and c.name in stats
        ]

    out = []
    for transport in [t for t in jobs if t != "ep1"] or ["ep1"]:
        for mbs in sorted({c.mbs for c in jobs[transport]}):
            ep1 = runs("ep1", mbs, False)
            off, on = (runs(transport, mbs, False), runs(transport, mbs, True)) if transport != "ep1" else ([], [])
            ep1_s, off_s, on_s = (mean([r["step_s"] for r in x]) for x in (ep1, off, on))
            row = dict(
                transport=transport,
                mbs=mbs,
                ep1_step_s=ep1_s,
                off_step_s=off_s,
                on_step_s=on_s,
                ep1_runs_s=[r["step_s"] for r in ep1],
                off_runs_s=[r["step_s"] for r in off],
                on_runs_s=[r["step_s"] for r in on],
                off_spread_s=[min(r["min_s"] for r in off), max(r["max_s"] for r in off)] if off else None,
                on_spread_s=[min(r["min_s"] for r in on), max(r["max_s"] for r in on)] if on else None,
                ep1_tflops_per_gpu=mean([r["tflops_per_gpu"] for r in ep1]),
                off_tflops_per_gpu=mean([r["tflops_per_gpu"] for r in off]),
                on_tflops_per_gpu=mean([r["tflops_per_gpu"] for r in on]),
                phases={
                    k: {
                        p: mean([r[p] for r in x if r[p] is not None])
                        for p in ("host_fwd_bwd_s", "gpu_fwd_bwd_s", "gpu_optimizer_s")
                    }
                    for k, x in (("ep1", ep1), ("off", off), ("on", on))
                },
                dispatch_on=on[0]["dispatch"] if on else None,
                loss_diff_first4=max(
                    (abs(a - b) for x, y in zip(off, on) for a, b in zip(x["losses"][:4], y["losses"][:4])),
                    default=None,
                ),
            )
            if ep1_s and off_s and on_s:
                row["on_vs_off"] = off_s / on_s
                row["on_vs_ep1"] = on_s / ep1_s
                row["hidden_share"] = (off_s - on_s) / (off_s - ep1_s) if off_s > ep1_s else None
            out.append(row)
    return out


def git_commit() -> str:
    return benchmark_jobs.git_commit(REPO)


def fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def step_cell(mean_s: float | None, runs_s: list[float]) -> str:
    """``0.430 s (0.432 / 0.428)``: the mean and each run in run order; ``-`` when nothing ran."""
    return f"{fmt(mean_s)} s ({' / '.join(fmt(x) for x in runs_s)})" if runs_s else "-"


def ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def mfu(tflops: float | None) -> str:
    return "-" if tflops is None else f"{100 * tflops / NOMINAL_PEAK_TFLOPS:.1f}%"


def markdown_section(result: dict) -> str:
    """The generated part of ``ep_overlap.md``: command, table, per-phase times."""
    stopped = (
        ""
        if result.get("complete", True)
        else (
            " **Partial: the run stopped after the jobs "
            + ", ".join(f"{job} (exit {code})" for job, code in result.get("exit_codes", {}).items())
            + ".**"
        )
    )
    lines = [
        f"Run: {result['date']}, commit `{result['commit']}`, {result['device']}; "
        f"bf16 matmul ceiling measured in the run: {fmt(result['ceiling_tflops'], 0)} TFLOP/s "
        f"(nominal peak {NOMINAL_PEAK_TFLOPS})." + stopped,
        "",
        "```bash",
        result["command"],
        "```",
        "",
        "| transport | MBS | EP=1 (compute only) | EP=2 overlap off | EP=2 overlap on | on vs off | on / EP=1 "
        "| EP overhead hidden | TFLOP/s per GPU (EP=1 / off / on) | MFU of 989.5 (on; ep1 rows: EP=1) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['transport']} | {r['mbs']} | {step_cell(r['ep1_step_s'], r['ep1_runs_s'])} "
            f"| {step_cell(r['off_step_s'], r['off_runs_s'])} | {step_cell(r['on_step_s'], r['on_runs_s'])} "
            f"| {ratio(r.get('on_vs_off'))} | {ratio(r.get('on_vs_ep1'))} | "
            f"{'-' if r.get('hidden_share') is None else f'{100 * r["hidden_share"]:.0f}%'} "
            f"| {fmt(r['ep1_tflops_per_gpu'], 0)} / {fmt(r['off_tflops_per_gpu'], 0)} "
            f"/ {fmt(r['on_tflops_per_gpu'], 0)} "
            f"| {mfu(r['on_tflops_per_gpu'] or r['ep1_tflops_per_gpu'])} |"
        )
    lines += [
        "",
        "Step times are steady-state means (iterations "
        f"{result['window'][0]}-{result['window'][1]}) per run, repeats in parentheses in run order. "
        "Per-phase means (GPU forward+backward / GPU optimizer / host launch of forward+backward):",
        "",
    ]
    for r in result["rows"]:
        ph = r["phases"]
        lines.append(
            f"- {r['transport']} MBS {r['mbs']}: "
            + "; ".join(
                f"{k} {fmt(v['gpu_fwd_bwd_s'])} / {fmt(v['gpu_optimizer_s'])} / {fmt(v['host_fwd_bwd_s'])} s"
                for k, v in ph.items()
            )
            + f"; largest loss difference off vs on over iterations 1-4: {fmt(r['loss_diff_first4'], 5)}"
        )
    dispatch = next((r["dispatch_on"] for r in result["rows"] if r["dispatch_on"]), None)
    if dispatch:
        lines += [
            "",
            "Token dispatch (overlap-on runs): "
            + "; ".join(
                f"{r['transport']}: {r['dispatch_on'][0]['description']}"
                for r in result["rows"]
                if r["dispatch_on"] and r["mbs"] == result["rows"][0]["mbs"]
            ),
        ]
    return "\n".join(lines)


def publish(results: list[dict]) -> None:
    """Write the results rows (each with its run's commit and command) and the generated tables."""
    rows_out = [dict(row, commit=res["commit"], command=res["command"]) for res in results for row in res["rows"]]
    RESULTS_JSON.write_text(json.dumps(rows_out, indent=2) + "\n")
    tables = "\n\n".join(markdown_section(res) for res in results)
    section = f"{BEGIN}\n{tables}\n{END}"
    text = RESULTS_MD.read_text() if RESULTS_MD.is_file() else "# EP overlap on two GPUs\n\n" + f"{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    RESULTS_MD.write_text(head + section + tail)
    print(f"== wrote {RESULTS_JSON} and {RESULTS_MD}", flush=True)


def rerun_argv(argv: list[str]) -> list[str]:
    """The arguments that re-run this benchmark: ``--commit`` (what was measured) left out, with its value."""
    return argv_without(argv, "--commit")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="working directory (logs, configs, results.json)")
    p.add_argument(
        "--republish",
        type=Path,
        nargs="+",
        metavar="RESULTS_JSON",
        help="only re-render the committed results from saved results.json files, in order (no runs)",
    )
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--window-start", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--mbs", type=int, nargs="+", default=[1, 2])
    p.add_argument(
        "--transports",
        nargs="*",
        default=["nvlink", "host_staged"],
        choices=["nvlink", "host_staged"],
        help="EP=2 jobs to run after the EP=1 reference (none: the reference only)",
    )
    p.add_argument(
        "--ep-dispatch",
        choices=sorted(DISPATCH_OVERRIDES),
        default="auto",
        help="EP=2 token dispatch: the product default (auto) or the torch-native sorted dispatcher",
    )
    p.add_argument(
        "--cuda-graph",
        choices=sorted(GRAPH_OVERRIDES),
        default="none",
        help="model.cuda_graph_impl of every case (full_iteration: captured after 2 eager steps)",
    )
    p.add_argument("--override", action="append", default=[], help="extra dotted override for every case")
    p.add_argument("--job-timeout", type=float, default=420.0)
    p.add_argument("--commit", help="commit the run measures (default: git rev-parse HEAD of this checkout)")
    p.add_argument(
        "--publish",
        action="store_true",
        help="write docs/benchmarks/ep_overlap_results.json and the table in ep_overlap.md",
    )
    return p.parse_args(argv)


def collect(
    args: argparse.Namespace,
    argv: list[str] | None,
    jobs: dict[str, list[Case]],
    codes: dict[str, int],
    ceiling: float | None,
) -> dict:
    """``results.json`` from the jobs run so far (``complete``: every job has run)."""
    return dict(
        date=time.strftime("%Y-%m-%d"),
        commit=args.commit or git_commit(),
        device=benchmark_jobs.device_name(),
        ceiling_tflops=ceiling,
        window=[args.window_start, args.steps],
        exit_codes=dict(codes),
        complete=len(codes) == len(jobs),
        command="uv run python scripts/performance/ep_overlap_benchmark.py "
        + shlex.join(rerun_argv(argv if argv is not None else sys.argv[1:])),
        harness_command_example="uv run python scripts/performance/run_script.py "
        + shlex.join(harness_argv(jobs[list(jobs)[-1]][-1], args)),
        rows=rows(jobs),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.republish:
        publish([json.loads(path.read_text()) for path in args.republish])
        return 0
    if args.out is None:
        raise SystemExit("--out is required to run the benchmark")
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    ceiling = matmul_ceiling_tflops()
    jobs = plan_cases(args)
    codes: dict[str, int] = {}
    for transport, cases in jobs.items():
        codes[transport] = run_job(transport, cases, args)
        # after every job: a run stopped later (a time limit, a lost node) keeps what finished
        result = collect(args, argv, jobs, codes, ceiling)
        (args.out / "results.json").write_text(json.dumps(result, indent=2))
    print(markdown_section(result), flush=True)
    if args.publish:
        publish([result])
    return 0 if all(c == 0 for c in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
