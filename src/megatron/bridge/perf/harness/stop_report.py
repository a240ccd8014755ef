"""What the harness says about a job that a signal stopped, or that ended while a Ctrl-C interrupted
the harness itself: read from what the ranks wrote (``summary.json``, the checkpoint directory)."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from pathlib import Path

from megatron.bridge.perf.harness.results import SUMMARY_NAME, load_summary
from megatron.bridge.perf.harness.supervisor import LAUNCH_LOG, JobOutcome
from megatron.bridge.training.harness_surface import inspect_checkpoint_dir, iteration_dir


def stop_message(summary_path: Path, outcome: JobOutcome, save_dir: str | None) -> str:
    """``stopped by SIGINT at iteration N; checkpoint at PATH``: the signal the harness received and
    what the ranks did, from what they wrote (``summary.json`` is written after their save)."""
    name = _name(outcome.stop_signal)
    if not summary_path.is_file():
        head = (
            f"killed by the second signal ({_name(outcome.kill_signal)}) before the ranks finished"
            if outcome.killed
            else f"stopped by {name} before training started"
        )
        on_disk = inspect_checkpoint_dir(save_dir) if save_dir else None
        if save_dir and on_disk is not None and on_disk.resumable and on_disk.iteration is not None:
            return f"{head}; latest checkpoint at {iteration_dir(save_dir, on_disk.iteration)}"
        return f"{head}; no checkpoint written"
    summary = load_summary(summary_path)
    where = summary.get("checkpoint")
    if where:
        saved = f"checkpoint at {where}"
    elif save_dir:
        saved = "no checkpoint written (no step ran)"
    else:
        saved = "no checkpoint (checkpoint.save is not set)"
    late = (
        f" (the second {_name(outcome.kill_signal)} came after the ranks had saved and written {SUMMARY_NAME}, "
        "and killed them as they exited)"
        if outcome.killed
        else ""
    )
    return f"stopped by {name} at iteration {summary.get('final_iteration')}; {saved}{late}"


def _name(signum: int | None) -> str:
    return signal.Signals(signum).name if signum else "signal"


def interrupted_message(ended: Sequence[Path]) -> str:
    """What a Ctrl-C that interrupted the harness itself leaves: nothing launched (it came while the
    config was built), or jobs that had already ended (it came while a result was reported, or between
    a sweep's jobs), the last one's outcome read from what it wrote."""
    if not ended:
        return "interrupted before launch: nothing was launched"
    last = ended[-1]
    return (
        f"interrupted after {len(ended)} launched job(s) had ended, before the harness finished reporting; "
        f"nothing more was launched. The last job, in {last}: {job_record(last)}"
    )


def job_record(log_dir: Path) -> str:
    """A finished job's outcome in one line, from its ``summary.json`` (else where its log is)."""
    try:
        summary = load_summary(log_dir / SUMMARY_NAME)
    except (OSError, ValueError):
        return f"no summary.json; its output is in {log_dir / LAUNCH_LOG}"
    where = summary.get("checkpoint")
    saved = f"checkpoint at {where}" if where else "no checkpoint written"
    return f"ran to iteration {summary.get('final_iteration')}; {saved}"
