"""Layer implementations on one GPU: the torch-native layers against Transformer Engine's layer spec.

The question: how fast does ``pretrain()`` (optimizer included) train the 4-layer Qwen3-30B-A3B-width
proxy on one GPU with each layer implementation, with the recipe's settings and with the best
Transformer Engine settings this project offers, with and without gradient-accumulation fusion, at
128 experts on the GPU and at 8 (one GPU's share of the expert work at EP=16), at MBS 1 and 2?

Every case is a ``run_script.py`` command line, built and validated by the harness; all cases train
one after another in one ``torchrun`` job (one start-up), interleaved: for each repeat, for each MBS
(the larger first), for each expert count, every arm. Steady state: iterations
``--window-start``..``--steps``. Cases that already have a ``summary.json`` in ``--out`` are not
run again, so the same command continues a run that was stopped (``--job-timeout``).

``--profile`` adds, after the timed cases, one profiled run per arm at 8 experts and MBS 1 (not timed:
the profiler slows the step) and a summary of each trace (``perf/analysis/trace_summary.py``).

Outputs: ``<out>/results.json``; with ``--publish``, ``docs/benchmarks/layer_specs_results.json``
(one row per arm, expert count and MBS) and the generated part of ``docs/benchmarks/layer_specs.md``.

    uv run python scripts/performance/layer_specs_benchmark.py --out runs/layer_specs --profile --publish
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from megatron.bridge.perf.analysis.trace_summary import format_summary, summarize_file
from megatron.bridge.perf.benchmarks import benchmark_jobs
from megatron.bridge.perf.benchmarks.benchmark_jobs import JOB_TIMED_OUT, NOMINAL_PEAK_TFLOPS, SAFE_ENV
from megatron.bridge.perf.harness.results import argv_without

REPO = Path(__file__).resolve().parents[2]
RESULTS_JSON = REPO / "docs" / "benchmarks" / "layer_specs_results.json"
RESULTS_MD = REPO / "docs" / "benchmarks" / "layer_specs.md"
BEGIN, END = "<!-- generated: begin -->", "<!-- generated: end -->"

TE_FUSIONS = {
    "model.moe_permute_fusion": True,
    "model.apply_rope_fusion": True,
    "model.bias_activation_fusion": True,
    "model.moe_router_fusion": True,
    "model.cross_entropy_fusion_impl": "te",
}
"""The Transformer Engine kernels the recipe leaves off (fused permutation, RoPE, SwiGLU, router, loss)."""


@dataclass(frozen=True)
class Arm:
    """One layer implementation with one set of settings."""

    name: str
    layer_spec: str
    settings: dict
    label: str

    @property
    def gradient_accumulation_fusion(self) -> bool:
        return bool(self.settings.get("model.gradient_accumulation_fusion", False))


ARMS: tuple[Arm, ...] = (
    Arm("torch_native", "torch_native", {}, "recipe"),
    Arm("te_recipe", "transformer_engine", {}, "recipe (every fusion off)"),
    Arm("te_fused", "transformer_engine", dict(TE_FUSIONS), "TE's fused kernels"),
    Arm(
        "te_fused_gaf",
        "transformer_engine",
        {**TE_FUSIONS, "model.gradient_accumulation_fusion": True},
        "TE's fused kernels + gradient-accumulation fusion",
    ),
)
EXPERTS = {128: {}, 8: {"model.num_moe_experts": 8, "model.moe_router_topk": 8}}
"""Experts on the GPU -> overrides (8: every token to all 8, one GPU's expert work at EP=16)."""
MICRO_BATCHES = 8
PROFILED_STEPS = (5, 6)


@dataclass
class Case:
    arm: Arm
    experts: int
    mbs: int
    repeat: int
    profiled: bool = False

    @property
    def name(self) -> str:
        kind = "profile" if self.profiled else f"r{self.repeat}"
        return f"{self.arm.name}_e{self.experts}_mbs{self.mbs}_{kind}"


def _value(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def harness_argv(case: Case, args: argparse.Namespace) -> list[str]:
    """The ``run_script.py`` command line of one case (what a user would type)."""
    steps = PROFILED_STEPS[1] if case.profiled else args.steps
    window = [2, steps] if case.profiled else [args.window_start, steps]
    overrides = {**case.arm.settings, **EXPERTS[case.experts]}
    argv = [
        "-m",
        "qwen",
        "-mr",
        "qwen3_30b_a3b",
        "--task",
        "pretrain",
        "-g",
        args.gpu,
        "-c",
        "bf16",
        "-ng",
        "1",
        "-ep",
        "1",
        "-mb",
        str(case.mbs),
        "-gb",
        str(case.mbs * MICRO_BATCHES),
        "-sl",
        "4096",
        "--max_steps",
        str(steps),
        "--cuda_graph_impl",
        "none",
        "--moe_flex_dispatcher_backend",
        "None",
        "--tokenizer_type",
        "NullTokenizer",
        "-l",
        str(args.out / case.name),
        f"model.num_layers={args.layers}",
        "scheduler.lr_warmup_iters=2",
        f"logger.steady_state_window=[{window[0]},{window[1]}]",
        f"model.layer_spec={case.arm.layer_spec}",
        *(f"{k}={_value(v)}" for k, v in overrides.items()),
        *args.override,
    ]
    if case.profiled:
        argv += [
            "profiling.use_pytorch_profiler=true",
            f"profiling.profile_step_start={PROFILED_STEPS[0]}",
            f"profiling.profile_step_end={PROFILED_STEPS[1]}",
        ]
    return argv


def selected_arms(args: argparse.Namespace) -> list[Arm]:
    return [a for a in ARMS if not args.arms or a.name in args.arms]


def plan_cases(args: argparse.Namespace) -> list[Case]:
    """Timed cases interleaved (repeat, then MBS from the largest, then experts, then arm), then the
    profiled ones."""
    cases = [
        Case(arm, experts, mbs, repeat)
        for repeat in range(args.repeats)
        for mbs in sorted(args.mbs, reverse=True)
        for experts in args.experts
        for arm in selected_arms(args)
    ]
    if args.profile:
        cases += [Case(arm, 8, 1, 0, profiled=True) for arm in selected_arms(args)]
    return cases


def load_summary(case: Case, args: argparse.Namespace) -> dict | None:
    path = args.out / case.name / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else None


FAILED_NAME = "benchmark_failure.json"


def failure(case: Case, args: argparse.Namespace) -> str | None:
    """Why an earlier job died in this case (``None``: it did not)."""
    path = args.out / case.name / FAILED_NAME
    return json.loads(path.read_text())["error"] if path.is_file() else None


def _record_failure(case: Case, args: argparse.Namespace, log: Path, code: int) -> None:
    """The job died in ``case``: keep the reason (from the rank's failure record, else the log's end)
    so the next job goes on with the cases after it."""
    records = sorted((args.out / case.name / "failures").glob("rank_*.json"))
    error = json.loads(records[0].read_text())["error"] if records else log.read_text()[-2000:]
    (args.out / case.name).mkdir(parents=True, exist_ok=True)
    (args.out / case.name / FAILED_NAME).write_text(json.dumps(dict(exit_code=code, error=error)))
    print(f"   {case.name} failed: {error[:300]}", flush=True)


def run_pending(cases: list[Case], args: argparse.Namespace) -> int:
    """Train every case that has neither a ``summary.json`` nor a recorded failure, in order, in as few
    ``torchrun`` jobs as failures allow (a job that dies is followed by one for the cases after the one
    it died in), within ``--job-timeout`` seconds in all. Exit status: 0, or the last job's."""
    deadline, code = time.time() + args.job_timeout, 0
    while True:
        pending = [c for c in cases if load_summary(c, args) is None and failure(c, args) is None]
        left = deadline - time.time()
        if not pending or left < 30:
            return code if not pending else JOB_TIMED_OUT
        paths, env = benchmark_jobs.write_configs(harness_argv(c, args) for c in pending)
        argv = benchmark_jobs.job_argv(1, args.out / "job", paths)
        log = args.out / f"job_{time.strftime('%H%M%S')}.log"
        print(f"== {len(pending)} runs ({len(cases) - len(pending)} done before), log {log}", flush=True)
        start = time.time()
        code = benchmark_jobs.run_logged(argv, {**os.environ, **env, **SAFE_ENV}, log, left)
        print(f"   exit {code} after {time.time() - start:.0f} s", flush=True)
        if code == JOB_TIMED_OUT:
            print("   --job-timeout reached; run the same command to continue", flush=True)
            return code
        died_in = next((c for c in pending if load_summary(c, args) is None), None)
        if code == 0 or died_in is None:
            return code
        _record_failure(died_in, args, log, code)


# ------------------------------------------------------------------------------ results


def rows(cases: list[Case], args: argparse.Namespace, commit: str) -> list[dict]:
    """One row per (arm, experts, MBS) with every finished repeat."""
    out = []
    for arm in selected_arms(args):
        for experts in args.experts:
            for mbs in sorted(args.mbs):
                runs = [
                    s
                    for c in cases
                    if (c.arm, c.experts, c.mbs, c.profiled) == (arm, experts, mbs, False)
                    and (s := load_summary(c, args))
                ]
                if not runs:
                    continue
                out.append(
                    dict(
                        arm=arm.name,
                        layer_spec=arm.layer_spec,
                        experts_per_gpu=experts,
                        settings={**arm.settings, **EXPERTS[experts]},
                        mbs=mbs,
                        step_s=[r["steady_state_mean_s"] for r in runs],
                        spread_s=[
                            min(r["steady_state_min_s"] for r in runs),
                            max(r["steady_state_max_s"] for r in runs),
                        ],
                        tflops_per_gpu=statistics.fmean(r["tflops_per_gpu"] for r in runs),
                        peak_mem_gib=max(r["peak_memory_gib"] for r in runs),
                        gradient_accumulation_fusion=arm.gradient_accumulation_fusion,
                        layer_spec_built=runs[0]["layer_spec"],
                        wgrad=runs[0]["gradient_accumulation_fusion"]["description"],
                        phases=_phases(runs, args),
                        commit=commit,
                    )
                )
    return out


def _phases(runs: list[dict], args: argparse.Namespace) -> dict:
    """Mean GPU forward+backward, GPU optimizer and host launch time over the steady windows."""

    def mean_of(key: str) -> float | None:
        values = [v for r in runs for v in r.get("extra", {}).get(key, [])[args.window_start - 1 : args.steps]]
        return statistics.fmean(values) if values else None

    return {key: mean_of(key) for key in ("gpu_fwd_bwd_s", "gpu_optimizer_s", "host_fwd_bwd_s")}


def profiles(cases: list[Case], args: argparse.Namespace) -> dict:
    """Each profiled run's trace summary, by arm."""
    out = {}
    for case in cases:
        trace = args.out / case.name / "profile" / f"trace_rank0_steps{PROFILED_STEPS[0]}-{PROFILED_STEPS[1]}.json"
        if case.profiled and trace.is_file():
            out[case.arm.name] = summarize_file(trace)
    return out


def fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def markdown_section(result: dict) -> str:
    """The generated part of ``layer_specs.md``: the run, its command, the table, the profiles."""
    partial = (
        ""
        if result["complete"]
        else (
            f" **Partial: the job stopped (exit {result['exit_code']}) before every case had run; the table holds "
            "the cases that finished.**"
        )
    )
    lines = [
        f"Run: {result['date']}, commit `{result['commit']}`, {result['device']}, Transformer Engine "
        f"{result['transformer_engine']}, torch {result['torch']}; bf16 matmul ceiling measured in the run: "
        f"{fmt(result['ceiling_tflops'], 0)} TFLOP/s "
        f"(MFU below is against the nominal {NOMINAL_PEAK_TFLOPS}).{partial}",
        "",
        "```bash",
        result["command"],
        "```",
        "",
        "| layers | experts on the GPU | settings | MBS | step (mean; each repeat) | spread | TFLOP/s per GPU | MFU "
        "| peak GiB | vs torch_native |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    native = {
        (r["experts_per_gpu"], r["mbs"]): statistics.fmean(r["step_s"])
        for r in result["rows"]
        if r["arm"] == "torch_native"
    }
    label = {a.name: a.label for a in ARMS}
    for r in sorted(
        result["rows"], key=lambda r: (-r["experts_per_gpu"], r["mbs"], [a.name for a in ARMS].index(r["arm"]))
    ):
        mean = statistics.fmean(r["step_s"])
        base = native.get((r["experts_per_gpu"], r["mbs"]))
        lines.append(
            f"| {r['layer_spec']} | {r['experts_per_gpu']} | {label.get(r['arm'], r['arm'])} | {r['mbs']} "
            f"| {mean:.3f} s ({' / '.join(f'{s:.3f}' for s in r['step_s'])}) "
            f"| {r['spread_s'][0]:.3f}-{r['spread_s'][1]:.3f} | {r['tflops_per_gpu']:.0f} "
            f"| {100 * r['tflops_per_gpu'] / NOMINAL_PEAK_TFLOPS:.1f}% | {r['peak_mem_gib']:.1f} "
            f"| {'-' if base is None else f'{mean / base:.2f}x'} |"
        )
    for name, error in result.get("failures", {}).items():
        lines.append(f"\nFailed: `{name}`: {error[:400]}")
    for arm, summary in result.get("profiles", {}).items():
        lines += [
            "",
            f"Profile, {arm}, 8 experts, MBS 1 (steps {PROFILED_STEPS[0]}-{PROFILED_STEPS[1]}):",
            "",
            "```",
            *format_summary(summary),
            "```",
        ]
    return "\n".join(lines)


def publish(result: dict) -> None:
    RESULTS_JSON.write_text(json.dumps([dict(r, command=result["command"]) for r in result["rows"]], indent=2) + "\n")
    text = RESULTS_MD.read_text() if RESULTS_MD.is_file() else f"# Layer implementations\n\n{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    RESULTS_MD.write_text(head + f"{BEGIN}\n{markdown_section(result)}\n{END}" + tail)
    print(f"== wrote {RESULTS_JSON} and {RESULTS_MD}", flush=True)


def collect(args: argparse.Namespace, argv: list[str], cases: list[Case], code: int, ceiling: float | None) -> dict:
    import torch

    from megatron.bridge.utils.import_utils import describe_transformer_engine

    commit = args.commit or benchmark_jobs.git_commit(REPO)
    done = [c for c in cases if load_summary(c, args) is not None or failure(c, args)]
    return dict(
        date=time.strftime("%Y-%m-%d"),
        commit=commit,
        device=benchmark_jobs.device_name(),
        transformer_engine=describe_transformer_engine(),
        torch=torch.__version__,
        ceiling_tflops=ceiling,
        window=[args.window_start, args.steps],
        exit_code=code,
        complete=len(done) == len(cases),
        command="uv run python scripts/performance/layer_specs_benchmark.py "
        + shlex.join(argv_without(argv, "--commit")),
        harness_command_example="uv run python scripts/performance/run_script.py "
        + shlex.join(harness_argv(cases[0], args)),
        rows=rows(cases, args, commit),
        profiles=profiles(cases, args),
        failures={c.name: f for c in cases if (f := failure(c, args))},
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="working directory (each case's logs, results.json)")
    p.add_argument(
        "--republish",
        type=Path,
        metavar="RESULTS_JSON",
        help="only write the committed rows and table from a saved results.json (no runs)",
    )
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--window-start", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--mbs", type=int, nargs="+", default=[1, 2])
    p.add_argument("--experts", type=int, nargs="+", default=[128, 8], choices=sorted(EXPERTS))
    p.add_argument("--arms", nargs="*", choices=[a.name for a in ARMS], help="only these arms (default: all)")
    p.add_argument("--gpu", default="h200", help="the harness's -g")
    p.add_argument("--override", action="append", default=[], help="extra dotted override for every case")
    p.add_argument("--profile", action="store_true", help="one profiled run per arm (8 experts, MBS 1)")
    p.add_argument(
        "--job-timeout",
        type=float,
        default=540.0,
        help="seconds for all jobs of this invocation; the same command continues afterwards",
    )
    p.add_argument("--commit", help="commit the run measures (default: git rev-parse HEAD of this checkout)")
    p.add_argument(
        "--publish",
        action="store_true",
        help="write docs/benchmarks/layer_specs_results.json and the table in layer_specs.md",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    if args.republish:
        publish(json.loads(args.republish.read_text()))
        return 0
    if args.out is None:
        raise SystemExit("--out is required to run the benchmark")
    # kept as given (relative to the working directory): the published commands name no machine path
    args.out.mkdir(parents=True, exist_ok=True)
    cases = plan_cases(args)
    ceiling = benchmark_jobs.matmul_ceiling_tflops()
    code = run_pending(cases, args)
    result = collect(args, argv, cases, code, ceiling)
    (args.out / "results.json").write_text(json.dumps(result, indent=2))
    print(markdown_section(result), flush=True)
    if args.publish:
        publish(result)
    return 0 if code == 0 and result["complete"] and not result["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
