"""End-of-run table from a run's ``summary.json`` (written by the training loop on rank 0).

The steady-state numbers are the mean/min/max step time over a window of iterations (1-based,
inclusive; 3-8 by default, Megatron-Bridge's method). When the summary already carries them for the
requested window they are used as written; otherwise they are recomputed from ``step_times_s``.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

DEFAULT_WINDOW = (3, 8)
SUMMARY_NAME = "summary.json"


@dataclass(frozen=True)
class SteadyState:
    """Step-time statistics (seconds) over the run's steps ``first..last`` (1-based, inclusive).

    Steps count from the start of this run; after a resume they are not the iteration numbers,
    which ``first_iteration``/``last_iteration`` hold when the summary lists them.
    """

    first: int
    last: int
    mean_s: float
    min_s: float
    max_s: float
    count: int
    first_iteration: Optional[int] = None
    last_iteration: Optional[int] = None

    def label(self) -> str:
        """``iterations 8-13 (steps 3-8 of this run)`` after a resume, ``iterations 3-8`` otherwise."""
        first_it = self.first if self.first_iteration is None else self.first_iteration
        last_it = self.last if self.last_iteration is None else self.last_iteration
        text = f"iterations {first_it}-{last_it}"
        if (first_it, last_it) != (self.first, self.last):
            text += f" (steps {self.first}-{self.last} of this run)"
        return text


def steady_state(
    step_times_s: Sequence[float], window: Sequence[int] = DEFAULT_WINDOW, iterations: Sequence[int] = ()
) -> Optional[SteadyState]:
    """Statistics over the window, clipped to the steps that ran; ``None`` when none did.

    ``iterations`` (the summary's iteration numbers, one per step) labels the window.
    """
    first, last = int(window[0]), int(window[1])
    chosen = list(step_times_s[first - 1 : last])
    if not chosen:
        return None
    last = first + len(chosen) - 1
    return SteadyState(
        first, last, statistics.fmean(chosen), min(chosen), max(chosen), len(chosen),
        *_iteration_numbers(iterations, first, last),
    )


def _iteration_numbers(iterations: Sequence[int], first: int, last: int) -> tuple[Optional[int], Optional[int]]:
    if len(iterations) < last:
        return None, None
    return int(iterations[first - 1]), int(iterations[last - 1])


def load_summary(path: "str | Path") -> dict[str, Any]:
    """Read ``summary.json`` (``path`` may be the file or the run directory)."""
    path = Path(path)
    if path.is_dir():
        path = path / SUMMARY_NAME
    return json.loads(path.read_text())


def summary_steady_state(summary: dict[str, Any], window: Optional[Sequence[int]] = None) -> Optional[SteadyState]:
    """The summary's own steady-state numbers for its window, or recomputed for ``window``."""
    written = summary.get("steady_state_window")
    window = list(window or written or DEFAULT_WINDOW)
    times = summary.get("step_times_s") or []
    iterations = summary.get("iterations") or []
    if written is not None and list(written) == window and summary.get("steady_state_mean_s") is not None:
        count = len(times[window[0] - 1 : window[1]]) or (window[1] - window[0] + 1)
        last = window[0] + count - 1
        return SteadyState(
            window[0],
            last,
            float(summary["steady_state_mean_s"]),
            float(summary.get("steady_state_min_s", summary["steady_state_mean_s"])),
            float(summary.get("steady_state_max_s", summary["steady_state_mean_s"])),
            count,
            *_iteration_numbers(iterations, window[0], last),
        )
    return steady_state(times, window, iterations)


def _fmt(value: Any, pattern: str) -> str:
    return "n/a" if value is None else pattern.format(value)


def format_results(summary: dict[str, Any], summary_path: "str | Path", window: Optional[Sequence[int]] = None) -> str:
    """The small table printed at the end of a run."""
    ss = summary_steady_state(summary, window)
    if ss is None:
        window_text, mean, lo, hi = "n/a", None, None, None
        note = f" (only {len(summary.get('step_times_s') or [])} iterations ran)"
    else:
        window_text, mean, lo, hi, note = ss.label(), ss.mean_s, ss.min_s, ss.max_s, ""
    rows = [
        ("steady-state window", window_text + note),
        ("step time mean", _fmt(mean, "{:.4f} s")),
        ("step time min", _fmt(lo, "{:.4f} s")),
        ("step time max", _fmt(hi, "{:.4f} s")),
        ("tokens/s", _fmt(summary.get("tokens_per_s"), "{:,.0f}")),
        ("TFLOP/s/GPU", _fmt(summary.get("tflops_per_gpu"), "{:.1f}")),
        ("peak memory", _fmt(summary.get("peak_memory_gib"), "{:.2f} GiB")),
        ("world size", _fmt(summary.get("world_size"), "{}")),
        ("final loss", _fmt((summary.get("losses") or [None])[-1], "{:.4f}")),
        ("summary", str(summary_path)),
    ]
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 40)
    body = "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
    return f"{line}\nResults\n{line}\n{body}\n{line}"


def argv_without(argv: Sequence[str], option: str) -> list[str]:
    """``argv`` with ``option`` and its value left out (``--opt V`` and ``--opt=V`` forms).

    Benchmark records keep the command that reproduces a measurement; options that only say where
    to write (an output path) or what to label it would make it name this machine's paths.
    """
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            kept.append(arg)
    return kept

