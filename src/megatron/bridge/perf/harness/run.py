"""The harness's main flow: parse, build, validate, report, launch, summarise (single run or sweep).

Exit codes: 0 success (or dry run / sbatch script written / nothing left to train: the checkpoint
already holds ``train.train_iters``), 2 usage or configuration errors (every violation listed,
nothing launched), 3 the machine cannot run the job (e.g. no GPU for a GPU run),
128 + N when signal N stopped the job (the ranks finished their step and saved), otherwise the
failing job's own exit code.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import signal
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence, TextIO

from megatron.bridge.perf.harness.argument_parser import parse_args
from megatron.bridge.perf.harness.config_builder import (
    BuiltConfig,
    HarnessError,
    build_config,
    effective_values,
    environment_summary,
    format_effective_rows,
    gpus_visible,
    resolution_of,
)
from megatron.bridge.perf.harness.failure_report import failure_report
from megatron.bridge.perf.harness.flag_notes import built_config_notes, flags_setting, override_key
from megatron.bridge.perf.harness.launch_values import launch_problems
from megatron.bridge.perf.harness.launcher import (
    CONFIG_NAME,
    TORCHRUN_DIR,
    LaunchPlan,
    choose_mode,
    plan_launch,
    run_plan,
)
from megatron.bridge.perf.harness.results import SUMMARY_NAME, format_results, load_summary, summary_steady_state
from megatron.bridge.perf.harness.run_dir import RunDirClaim, RunDirError, claim, make_child_dir, run_dir_problems
from megatron.bridge.perf.harness.stop_report import interrupted_message, stop_message
from megatron.bridge.perf.harness.sweep import combine_rounds, job_dirname, parse_sweep, write_sweep_outputs
from megatron.bridge.training.harness_surface import (
    FAILURE_DIR,
    CheckpointDir,
    ConfigError,
    check_override_names,
    inspect_checkpoint_dir,
)
from megatron.bridge.utils.gpu_count import too_few_gpus
from megatron.bridge.utils.owned_files import describe_os_error, replace_file
from megatron.bridge.utils.quiet import marked, unmarked

if TYPE_CHECKING:
    from megatron.bridge.training.harness_surface import ConfigContainer, Resolution

EXIT_CONFIG = 2
EXIT_ENVIRONMENT = 3


@dataclass
class Job:
    """One resolved, launchable run: everything it shows, saves and launches comes from ``resolution``."""

    built: BuiltConfig
    resolution: "Resolution"
    plan: LaunchPlan
    config_text: str
    """The YAML the ranks load (copies equal the effective values), written by :func:`prepare`; the
    ranks get its digest and refuse any other file."""
    claim: Optional[RunDirClaim] = None
    """The harness's hold on its run directory, from :func:`prepare` on."""

    @property
    def resolved(self) -> "ConfigContainer":
        """The finalized config the ranks will train."""
        return self.resolution.config

    @property
    def report(self) -> str:
        """The full overlap report, without its heading line (``describe`` prints its own)."""
        return self.resolution.report.format(heading=False)

    @property
    def brief_report(self) -> str:
        """The overlap report without the lines the ranks' start-up repeats."""
        return self.resolution.report.format(brief=True)

    def save_config(self, path: "str | Path") -> None:
        """Write the effective config (what the ranks load) where ``--save_config_filepath`` says."""
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            replace_file(path, self.config_text)
        except OSError as exc:
            raise HarnessError(f"--save_config_filepath {path}: {describe_os_error(exc, path)}") from None


def checkpoint_notes(resolved) -> list[str]:
    """Where the run starts from, said before launch (validation has refused unusable directories)."""
    ckpt = resolved.checkpoint
    if not ckpt.load:
        if ckpt.save:
            return [f"starts from iteration 0; checkpoints go to {ckpt.save}"]
        return ["no checkpoints (checkpoint.save=DIR checkpoint.load=DIR: save there, resume from there)"]
    found = inspect_checkpoint_dir(ckpt.load)
    done = _finished(resolved, found)
    if done:
        return [done]
    if found.resumable:
        return [f"resumes from iteration {found.iteration} in {ckpt.load}"]
    return [f"{ckpt.load} holds no checkpoint yet: starts from iteration 0 and saves there"]


def nothing_to_train(resolved) -> Optional[str]:
    """Why the run has no step left (``checkpoint.load`` already holds ``train.train_iters``
    iterations or more), decided here so that no rank is started for it; ``None`` otherwise."""
    if not resolved.checkpoint.load:
        return None
    return _finished(resolved, inspect_checkpoint_dir(resolved.checkpoint.load))


def _finished(resolved, found: CheckpointDir) -> Optional[str]:
    """:func:`nothing_to_train` for the ``checkpoint.load`` directory already read as ``found``."""
    total = resolved.train.train_iters
    if not isinstance(total, int) or not found.resumable or found.iteration < total:
        return None
    return (f"nothing to train: {resolved.checkpoint.load} holds iteration {found.iteration} "
            f"and train.train_iters={total} "
            f"(to train on, raise --max_steps / train.train_iters above {found.iteration}; to start over, "
            "point checkpoint.load at another directory)")


def data_notes(resolved) -> list[str]:
    """Which data trains, said before launch when it is not mock data (``dataset.data_path`` is the
    alias that writes ``dataset.data_paths``)."""
    ds = resolved.dataset
    if ds.is_mock:
        return []
    return [f"data: indexed dataset dataset.data_paths={ds.data_paths} (alias dataset.data_path)"]


def make_job(built: BuiltConfig, args, max_connections: Optional[int] = None) -> Job:
    """Resolve once (raises ``ConfigError`` with every violation) and plan the launch."""
    built.notes += built_config_notes(args, built)  # a flag and a dotted override that set one field
    resolution = resolution_of(built)
    text = resolution.effective.to_yaml()
    return Job(built, resolution, plan_job(built, resolution, args, max_connections, digest(text)), text)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def plan_job(built: BuiltConfig, resolution: "Resolution", args, max_connections: Optional[int] = None,
             config_sha256: Optional[str] = None) -> LaunchPlan:
    """The launch of a resolved job. ``max_connections`` replaces the report's
    ``CUDA_DEVICE_MAX_CONNECTIONS`` (sweeps keep the environment identical across values)."""
    needed = resolution.report.cuda_device_max_connections
    launched_gpus, gpus_per_node = (1, 1) if built.emulated else (built.num_gpus, built.gpus_per_node)
    problems = launch_problems(
        account=args.account, partition=args.partition, time_limit=args.time_limit, log_dir=built.log_dir,
        written_to_batch_script=choose_mode(cpu=built.cpu, num_gpus=launched_gpus, gpus_per_node=gpus_per_node,
                                            environ=os.environ) == "sbatch",
    )
    if problems:
        raise HarnessError("the launch cannot be written:\n" + "\n".join(f"  - {p}" for p in problems), EXIT_CONFIG)
    return plan_launch(
        cpu=built.cpu,
        num_gpus=launched_gpus,  # an emulated world is one process
        gpus_per_node=gpus_per_node,
        procs_per_gpu=built.procs_per_gpu,
        config_path=built.log_dir / CONFIG_NAME,
        log_dir=built.log_dir,
        cuda_device_max_connections=max_connections if max_connections is not None else needed,
        account=args.account,
        partition=args.partition,
        time_limit=args.time_limit,
        job_name=built.recipe.function_name.removesuffix("_config"),
        verbose=args.verbose,
        config_sha256=config_sha256,
        save_dir=resolution.config.checkpoint.save,
    )


def describe(job: Job, out: TextIO, *, verbose: bool = True, dryrun: bool = False) -> None:
    """What will run: environment, notes, overlap report, effective values, launch command (in a
    dry run an sbatch script is only described: nothing is written)."""
    print(f"== {environment_summary(job.built)}", file=out)
    for note in job.built.notes + job.plan.notes + checkpoint_notes(job.resolved) + data_notes(job.resolved):
        print(f"   note: {note}", file=out)
    if verbose:
        print("== overlap report", file=out)
        print(job.report, file=out)
        print("== effective overlap-related values [source]", file=out)
        print(format_effective_rows(effective_values(job.built, job.resolution)), file=out)
    else:
        print("== " + job.brief_report, file=out)
    print(f"== launch ({job.plan.mode})", file=out)
    print(f"   {job.plan.shell()}", file=out)
    if job.plan.script_text:
        if dryrun:
            print(f"   (dry run: {job.plan.script_path} is not written; run without --dryrun to write it)", file=out)
        print("   the script runs, on every node:", file=out)
        print("   " + next(line for line in job.plan.script_text.splitlines() if line.startswith("srun")), file=out)


def check_machine(job: Job) -> None:
    """Fail fast when this machine cannot run the job locally (instead of hanging in NCCL init)."""
    if job.plan.mode == "srun" and shutil.which("srun") is None:
        raise HarnessError(
            "SLURM_JOB_ID is set, so the job would start with srun, but this machine has no srun on PATH. "
            "Run the harness inside the allocation (where srun exists), or unset SLURM_JOB_ID to launch here",
            EXIT_ENVIRONMENT,
        )
    if job.plan.mode != "torchrun":
        return
    have, need = gpus_visible(), 1 if job.built.emulated else job.built.num_gpus
    if have < need:
        raise HarnessError(
            f"{too_few_gpus(have, need, f'-ng {need}')}. "
            "Use --dryrun to validate here, -g cpu for the CPU smoke mode, run inside a SLURM "
            "allocation (srun), or ask for more GPUs per node with -gn to get an sbatch script.",
            EXIT_ENVIRONMENT,
        )


def prepare(job: Job) -> None:
    """Claim the run directory (``run_dir``: made or reused as this harness's own, locked, an
    earlier run's results removed), make the directories the ranks write into, and write the config
    the workers load (and the sbatch script). Nothing here writes through a link."""
    log_dir = job.built.log_dir
    try:
        job.claim = claim(log_dir)
        for child in (FAILURE_DIR, TORCHRUN_DIR):
            make_child_dir(log_dir, child)
        replace_file(log_dir / CONFIG_NAME, job.config_text)
        if job.plan.script_path is not None:
            replace_file(job.plan.script_path, job.plan.script_text or "", perms=0o755)
    except RunDirError as exc:
        raise HarnessError(f"[run-dir-usable] {exc}") from None
    except OSError as exc:
        raise HarnessError(f"cannot write the run directory {log_dir}: {describe_os_error(exc, log_dir)}") from None


def execute(job: Job, out: TextIO, window: Optional[Sequence[int]], verbose: bool = False,
            ended: Optional[list[Path]] = None) -> tuple[int, bool]:
    """Launch; print the results table (or how it stopped, or which rank failed first). The job's
    directory is added to ``ended`` once the job and its ranks are gone (:func:`interrupted_message`).

    Returns the exit code for the harness and whether a signal stopped the job."""
    print(f"== starting {job.plan.nprocs} rank(s): importing torch and megatron-core takes about a "
          "minute on a small machine; Ctrl-C stops the job after the current step, with a checkpoint "
          "when checkpoint.save is set", file=out, flush=True)
    outcome = run_plan(job.plan, stream=out, verbose=verbose)
    if ended is not None:
        ended.append(job.built.log_dir)
    summary_path = job.built.log_dir / SUMMARY_NAME
    if outcome.stopped:
        if outcome.exit_code != 0 and not outcome.killed:
            print(console_text(failure_report(job.built.log_dir, outcome.exit_code, outcome.launcher_lines), verbose),
                  file=out)
        if summary_path.is_file() and load_summary(summary_path).get("step_times_s"):
            print(format_results(load_summary(summary_path), summary_path, window), file=out)
        print(stop_message(summary_path, outcome, job.resolved.checkpoint.save), file=out)
        return 128 + outcome.stop_signal, True
    if outcome.exit_code != 0:
        print(console_text(failure_report(job.built.log_dir, outcome.exit_code, outcome.launcher_lines), verbose),
              file=out)
    elif summary_path.is_file():
        print(format_results(load_summary(summary_path), summary_path, window), file=out)
    else:
        print(f"warning: the run ended without writing {summary_path}", file=out)
    if job.claim is not None and not job.claim.still_there():
        print(f"note: the run directory {job.built.log_dir} was removed or replaced during the run (not by this "
              "harness): the ranks' logs and results in it are gone, so what is reported above may be incomplete",
              file=out)
    if outcome.leftovers_killed:
        print(f"note: killed {outcome.leftovers_killed} rank process(es) that outlived the launcher", file=out)
    traces = sorted(p for p in job.built.log_dir.rglob("*.json*") if "trace" in p.name)
    for trace in traces:
        print(f"profile trace: {trace}\n  analyse: uv run python scripts/performance/analyze_overlap.py {trace}",
              file=out)
    return outcome.exit_code, False


def console_text(report: str, verbose: bool) -> str:
    """A report quoting rank logs, as the console shows rank output: without the known third-party
    noise the ranks marked (``utils.quiet``), unless ``verbose``."""
    return "\n".join(unmarked(line) for line in report.splitlines() if verbose or not marked(line))


def run_single(args, out: TextIO) -> int:
    job = make_job(build_config(args), args)
    done = nothing_to_train(job.resolved)
    if done and not args.dryrun:  # decided here, not after the ranks have started
        print(f"== {environment_summary(job.built)}\n== {done}\n   nothing was launched", file=out)
        if args.save_config_filepath:
            job.save_config(args.save_config_filepath)
            print(f"== config written to {args.save_config_filepath}", file=out)
        return 0
    if not args.dryrun:
        check_machine(job)  # before the launch is described: a launch this machine cannot run is not shown
    describe(job, out, verbose=args.verbose or args.dryrun, dryrun=args.dryrun)
    if args.save_config_filepath:
        job.save_config(args.save_config_filepath)
        print(f"== config written to {args.save_config_filepath}", file=out)
    if args.dryrun:
        print("== dry run: nothing launched", file=out)
        return 0
    prepare(job)
    if job.plan.mode == "sbatch":
        print(f"== wrote {job.plan.script_path}\n"
              f"   submit it with: {shlex.join(['sbatch', str(job.plan.script_path)])}",
              file=out)
        return 0
    return execute(job, out, args.steady_state_window, args.verbose, args.ended_jobs)[0]


def sweep_root(args) -> Path:
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


def same_environment(jobs: list[Job], args, out: TextIO) -> list[Job]:
    """Give every job of a sweep the same ``CUDA_DEVICE_MAX_CONNECTIONS`` so only the swept key differs.

    The value one job needs (e.g. 32 for EP overlap) is harmless for the others (megatron-core only
    requires 1 for TP/CP comm overlap on pre-Blackwell GPUs); conflicting needs are left per job.
    """
    key = "CUDA_DEVICE_MAX_CONNECTIONS"
    needs = {job.plan.env.get(key) for job in jobs} - {None}
    if len(needs) != 1:
        if len(needs) > 1:
            print(f"   note: sweep values need different {key} ({sorted(needs)}); kept per job", file=out)
        return jobs
    value = int(needs.pop())
    return [
        job if job.plan.env.get(key) == str(value)
        else replace(job, plan=plan_job(job.built, job.resolution, args, value, digest(job.config_text)))
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


def run_sweep(args, out: TextIO) -> int:
    """Every value of the swept key as its own job (all validated before the first launches)."""
    try:
        spec = parse_sweep(args.sweep)
    except ValueError as exc:
        raise HarnessError(str(exc)) from None
    root = sweep_root(args)
    problems = run_dir_problems(root)
    if problems:
        raise HarnessError("[run-dir-usable] the sweep's directory cannot be used:\n"
                           + "\n".join(f"  - {p}" for p in problems))
    shadowed = [o for o in args.overrides if override_key(o) == spec.key] + flags_setting(args, spec.key)
    if shadowed:
        print(f"   note: the swept values replace {', '.join(shadowed)} given on the command line", file=out)
    rounds = args.sweep_repeats
    plan = [(r, i, v) for r in range(1, rounds + 1) for i, v in enumerate(spec.values)]  # interleaved
    jobs = [
        make_job(build_config(args, extra_overrides=[spec.override(v)],
                              log_dir=root / job_dirname(spec, i, v, r if rounds > 1 else None)), args)
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
            print(f"== wrote {job.plan.script_path} (submit with: {shlex.join(['sbatch', str(job.plan.script_path)])})",
                  file=out)
        print("   after the jobs finish, each directory holds its summary.json", file=out)
        return 0
    outcomes: dict[int, list] = {i: [] for i in range(len(spec.values))}
    worst = 0
    for (round_number, index, value), job in zip(plan, jobs):
        label = f" (round {round_number} of {rounds})" if rounds > 1 else ""
        print(f"== running {spec.key}={value}{label} in {job.built.log_dir}", file=out)
        prepare(job)
        code, stopped = execute(job, out, args.steady_state_window, args.verbose, args.ended_jobs)
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


def main(argv: Optional[Sequence[str]] = None, out: Optional[TextIO] = None) -> int:
    """Entry point of ``scripts/performance/run_script.py``; returns the process exit code."""
    out = out or sys.stdout
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    args.argv = argv
    args.ended_jobs = []
    try:
        check_override_names([*args.overrides, *([args.sweep] if args.sweep else [])])  # before megatron-core loads
        return run_sweep(args, out) if args.sweep else run_single(args, out)
    except NothingToTrain as exc:
        print(f"== {exc}\n   nothing was launched", file=out)
        return 0
    except HarnessError as exc:  # raised before anything is launched
        print(f"error: {exc}", file=out)
        print("nothing was launched", file=out)
        return exc.exit_code
    except ConfigError as exc:
        print(f"error: {exc}", file=out)
        print("nothing was launched", file=out)
        return EXIT_CONFIG
    except KeyboardInterrupt:  # Ctrl-C outside a job (during one, the supervisor turns it into a stop)
        print(interrupted_message(args.ended_jobs), file=out)
        return 128 + signal.SIGINT
