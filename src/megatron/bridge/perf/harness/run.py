"""The harness's main flow: parse, build, validate, report, launch, summarise (single run or sweep).

The steps are modules of their own: a resolved job and its plan (``job``), running it
(``execution``), a sweep's jobs (``sweep_runs``).

Exit codes: 0 success (or dry run / sbatch script written / nothing left to train: the checkpoint
already holds ``train.train_iters``), 2 usage or configuration errors (every violation listed,
nothing launched), 3 the machine cannot run the job (e.g. no GPU for a GPU run),
128 + N when signal N stopped the job (the ranks finished their step and saved), otherwise the
failing job's own exit code.
"""

from __future__ import annotations

import shlex
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from megatron.bridge.perf.harness.argument_parser import parse_args
from megatron.bridge.perf.harness.config_builder import HarnessError, build_config, environment_summary
from megatron.bridge.perf.harness.execution import execute, prepare
from megatron.bridge.perf.harness.harness_args import HarnessArgs
from megatron.bridge.perf.harness.job import EXIT_CONFIG, check_machine, describe, make_job, nothing_to_train
from megatron.bridge.perf.harness.stop_report import interrupted_message
from megatron.bridge.perf.harness.sweep_runs import NothingToTrain, run_sweep
from megatron.bridge.training.harness_surface import ConfigError, check_override_names


def run_single(args: HarnessArgs, out: TextIO, ended: list[Path]) -> int:
    """One job: resolved, described, launched; its directory is added to ``ended`` when it ended."""
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
        print(
            f"== wrote {job.plan.script_path}\n   submit it with: {shlex.join(['sbatch', str(job.plan.script_path)])}",
            file=out,
        )
        return 0
    return execute(job, out, args.steady_state_window, args.verbose, ended)[0]


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of ``scripts/performance/run_script.py``; returns the process exit code."""
    out = out or sys.stdout
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    ended: list[Path] = []  # the jobs that ran to their end, for what a Ctrl-C between them says
    try:
        check_override_names([*args.overrides, *([args.sweep] if args.sweep else [])])  # before megatron-core loads
        return run_sweep(args, out, ended) if args.sweep else run_single(args, out, ended)
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
        print(interrupted_message(ended), file=out)
        return 128 + signal.SIGINT
