"""A planned :class:`~megatron.bridge.perf.harness.job.Job` run to its end: its run directory
claimed and written (``prepare``), the launch supervised, and what ended it reported (``execute``):
the results table, how a signal stopped it, or which rank failed first."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from megatron.bridge.perf.harness.config_builder import HarnessError
from megatron.bridge.perf.harness.failure_report import failure_report
from megatron.bridge.perf.harness.job import Job
from megatron.bridge.perf.harness.launcher import CONFIG_NAME, TORCHRUN_DIR, run_plan
from megatron.bridge.perf.harness.results import SUMMARY_NAME, format_results, load_summary
from megatron.bridge.perf.harness.run_dir import RunDirError, claim, make_child_dir
from megatron.bridge.perf.harness.stop_report import stop_message
from megatron.bridge.training.harness_surface import FAILURE_DIR
from megatron.bridge.utils.owned_files import describe_os_error, replace_file
from megatron.bridge.utils.quiet import marked, unmarked


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


def execute(
    job: Job, out: TextIO, window: Sequence[int] | None, verbose: bool = False, ended: list[Path] | None = None
) -> tuple[int, bool]:
    """Launch; print the results table (or how it stopped, or which rank failed first). The job's
    directory is added to ``ended`` once the job and its ranks are gone (``stop_report.interrupted_message``).

    Returns the exit code for the harness and whether a signal stopped the job."""
    print(
        f"== starting {job.plan.nprocs} rank(s): importing torch and megatron-core takes about a "
        "minute on a small machine; Ctrl-C stops the job after the current step, with a checkpoint "
        "when checkpoint.save is set",
        file=out,
        flush=True,
    )
    outcome = run_plan(job.plan, stream=out, verbose=verbose)
    if ended is not None:
        ended.append(job.built.log_dir)
    summary_path = job.built.log_dir / SUMMARY_NAME
    if outcome.stop_signal is not None:  # a signal stopped the job
        if outcome.exit_code != 0 and not outcome.killed:
            print(
                console_text(failure_report(job.built.log_dir, outcome.exit_code, outcome.launcher_lines), verbose),
                file=out,
            )
        if summary_path.is_file() and load_summary(summary_path).get("step_times_s"):
            print(format_results(load_summary(summary_path), summary_path, window), file=out)
        print(stop_message(summary_path, outcome, job.resolved.checkpoint.save), file=out)
        return 128 + outcome.stop_signal, True
    if outcome.exit_code != 0:
        print(
            console_text(failure_report(job.built.log_dir, outcome.exit_code, outcome.launcher_lines), verbose),
            file=out,
        )
    elif summary_path.is_file():
        print(format_results(load_summary(summary_path), summary_path, window), file=out)
    else:
        print(f"warning: the run ended without writing {summary_path}", file=out)
    if job.claim is not None and not job.claim.still_there():
        print(
            f"note: the run directory {job.built.log_dir} was removed or replaced during the run (not by this "
            "harness): the ranks' logs and results in it are gone, so what is reported above may be incomplete",
            file=out,
        )
    if outcome.leftovers_killed:
        print(f"note: killed {outcome.leftovers_killed} rank process(es) that outlived the launcher", file=out)
    traces = sorted(p for p in job.built.log_dir.rglob("*.json*") if "trace" in p.name)
    for trace in traces:
        print(
            f"profile trace: {trace}\n  analyse: uv run python scripts/performance/analyze_overlap.py {trace}", file=out
        )
    return outcome.exit_code, False


def console_text(report: str, verbose: bool) -> str:
    """A report quoting rank logs, as the console shows rank output: without the known third-party
    noise the ranks marked (``utils.quiet``), unless ``verbose``."""
    return "\n".join(unmarked(line) for line in report.splitlines() if verbose or not marked(line))
