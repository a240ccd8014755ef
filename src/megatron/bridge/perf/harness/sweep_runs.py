"""A harness sweep run (``--sweep key=v1,v2 [--sweep_repeats N]``): every value as its own job, all
resolved and validated before the first launches, run interleaved, then ``sweep.md`` and
``sweep.png`` (``sweep`` reads the request and writes the outputs)."""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from megatron.bridge.perf.harness.config_builder import HarnessError, build_config
from megatron.bridge.perf.harness.execution import execute, prepare
from megatron.bridge.perf.harness.flag_notes import flags_setting, override_key
from megatron.bridge.perf.harness.harness_args import HarnessArgs
from megatron.bridge.perf.harness.job import Job, check_machine, describe, digest, make_job, nothing_to_train, plan_job
from megatron.bridge.perf.harness.results import SUMMARY_NAME, load_summary, summary_steady_state
from megatron.bridge.perf.harness.run_dir import RunDirClaim, RunDirError, claim, run_dir_problems
from megatron.bridge.perf.harness.sweep import combine_rounds, job_dirname, parse_sweep, write_sweep_outputs
from megatron.bridge.training.harness_surface import LAUNCH_ALLOCATOR_VAR as ALLOCATOR


def sweep_root(args: HarnessArgs) -> Path:
    """``-l``, else a new name for this sweep (``runs/<recipe>_<task>_sweep_<time>_<token>``)."""
    if args.log_dir:
        return Path(args.log_dir).resolve()
    # Deferred: the metrics module is the ranks' logger and imports torch and megatron-core.
    from megatron.bridge.training.harness_surface import default_log_dir

    return Path(default_log_dir(f"{args.model_recipe_name}_{args.task}_sweep"))


def claim_sweep_root(root: Path) -> RunDirClaim:
    """The sweep's own directory (its jobs' directories and ``sweep.md`` go into it)."""
    try:
        return claim(root)
    except RunDirError as exc:
        raise HarnessError(f"[run-dir-usable] {exc}") from None


def same_environment(jobs: list[Job], args: HarnessArgs, out: TextIO) -> list[Job]:
    """Give every job of a sweep the same ``CUDA_DEVICE_MAX_CONNECTIONS`` and allocator setting, so
    only the swept key differs.

    The connections one job needs (e.g. 32 for EP overlap) are harmless for the others (megatron-core
    only requires 1 for TP/CP comm overlap on pre-Blackwell GPUs); conflicting needs are left per job.
    The expandable segments a graphed job launches with go to every job: an eager one runs with them.
    """
    key = "CUDA_DEVICE_MAX_CONNECTIONS"
    needs = {need for job in jobs if (need := job.plan.env.get(key)) is not None}
    if len(needs) > 1:
        print(f"   note: sweep values need different {key} ({sorted(needs)}); kept per job", file=out)
    value = int(needs.pop()) if len(needs) == 1 else None
    allocator = next(({ALLOCATOR: job.plan.env[ALLOCATOR]} for job in jobs if ALLOCATOR in job.plan.env), None)

    def fits(job: Job) -> bool:
        env = job.plan.env
        return (value is None or env.get(key) == str(value)) and (
            allocator is None or env.get(ALLOCATOR) == allocator[ALLOCATOR]
        )

    return [
        job
        if fits(job)
        else replace(
            job, plan=plan_job(job.built, job.resolution, args, value, digest(job.config_text), allocator=allocator)
        )
        for job in jobs
    ]


class NothingToTrain(Exception):
    """Every job of the request is already trained to ``train.train_iters``: nothing is launched (exit 0)."""


def finished_sweep(key: str, done: list[tuple[str, str]], total: int) -> None:
    """A sweep whose jobs' checkpoints already hold ``train.train_iters``: all of them, nothing to do
    (:class:`NothingToTrain`); some of them, refused (the sweep would compare trained with untrained)."""
    lines = "\n".join(f"  - {key}={value}: {reason}" for value, reason in done)
    if len(done) == total:
        raise NothingToTrain(f"every sweep job has nothing to train:\n{lines}")
    raise HarnessError(
        f"[sweep-every-job-trains] {len(done)} of {total} sweep jobs have nothing to train, so the sweep would "
        f"compare them with jobs that train:\n{lines}\n    fix: give each swept value a checkpoint.load that holds "
        "fewer iterations than train.train_iters (or none), or raise --max_steps"
    )


def run_sweep(args: HarnessArgs, out: TextIO, ended: list[Path]) -> int:
    """Every value of the swept key as its own job (all validated before the first launches); the
    directory of each job that ended is added to ``ended``."""
    if args.sweep is None:
        raise ValueError("a sweep run needs --sweep (main runs one job without it)")
    try:
        spec = parse_sweep(args.sweep)
    except ValueError as exc:
        raise HarnessError(str(exc)) from None
    root = sweep_root(args)
    problems = run_dir_problems(root)
    if problems:
        raise HarnessError(
            "[run-dir-usable] the sweep's directory cannot be used:\n" + "\n".join(f"  - {p}" for p in problems)
        )
    shadowed = [o for o in args.overrides if override_key(o) == spec.key] + flags_setting(args, spec.key)
    if shadowed:
        print(f"   note: the swept values replace {', '.join(shadowed)} given on the command line", file=out)
    rounds = args.sweep_repeats
    plan = [(r, i, v) for r in range(1, rounds + 1) for i, v in enumerate(spec.values)]  # interleaved
    jobs = [
        make_job(
            build_config(
                args,
                extra_overrides=[spec.override(v)],
                log_dir=root / job_dirname(spec, i, v, r if rounds > 1 else None),
            ),
            args,
        )
        for r, i, v in plan
    ]
    jobs = same_environment(jobs, args, out)
    done = [(value, reason) for value, job in zip(spec.values, jobs) if (reason := nothing_to_train(job.resolved))]
    if done and not args.dryrun:  # (the rounds repeat the first round's jobs)
        finished_sweep(spec.key, done, len(spec.values))
    if not args.dryrun:
        check_machine(jobs[0])  # before the launches are described
    for value, job in zip(spec.values, jobs):  # the rounds repeat the first round's jobs
        print(f"== sweep {spec.key}={value}" + (f" ({rounds} rounds, interleaved)" if rounds > 1 else ""), file=out)
        describe(job, out, verbose=(args.verbose or args.dryrun) and job is jobs[0], dryrun=args.dryrun)
    if args.save_config_filepath:
        jobs[0].save_config(args.save_config_filepath)
    if args.dryrun:
        print("== dry run: nothing launched", file=out)
        return 0
    claim_sweep_root(root)  # its lock is held until the harness exits
    if jobs[0].plan.mode == "sbatch":
        for job in jobs:
            prepare(job)
            print(
                f"== wrote {job.plan.script_path} (submit with: {shlex.join(['sbatch', str(job.plan.script_path)])})",
                file=out,
            )
        print("   after the jobs finish, each directory holds its summary.json", file=out)
        return 0
    outcomes: dict[int, list] = {i: [] for i in range(len(spec.values))}
    worst = 0
    for (round_number, index, value), job in zip(plan, jobs):
        label = f" (round {round_number} of {rounds})" if rounds > 1 else ""
        print(f"== running {spec.key}={value}{label} in {job.built.log_dir}", file=out)
        prepare(job)
        code, stopped = execute(job, out, args.steady_state_window, args.verbose, ended)
        if stopped:
            print("== sweep stopped by signal: the remaining values were not run", file=out)
            return code
        summary_path = job.built.log_dir / SUMMARY_NAME
        stats = None
        if code == 0 and summary_path.is_file():
            stats = summary_steady_state(load_summary(summary_path), args.steady_state_window)
        outcomes[index].append((str(job.built.log_dir), stats, code))
        worst = worst or code
    points = [combine_rounds(v, *map(list, zip(*outcomes[i]))) for i, v in enumerate(spec.values)]
    command = shlex.join(["uv", "run", "python", "scripts/performance/run_script.py", *args.argv])
    md, png = write_sweep_outputs(spec, points, root, command, cpu=jobs[0].built.cpu)
    print(md.read_text(), file=out)
    print(f"== wrote {md}" + (f" and {png}" if png else " (matplotlib missing: no plot)"), file=out)
    return worst
