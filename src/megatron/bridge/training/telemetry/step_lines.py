"""The console line of a training step: short enough to read behind a launcher's ``[default0]:``
label (under 160 columns with the largest numbers a run shows), with the full record beside it.

The short line holds what a user watches: progress, loss, step time, throughput, memory, an
emulated run's modeled communication and the time left. The full line adds every other scalar of
the step (learning rate, gradient norm, phase times, MoE auxiliary losses); it is printed instead
with ``verbose``, and under the harness also as a marked line (``utils/quiet.py``), which the
console leaves out and ``launch.log`` keeps. ``summary.json`` holds every value of every step.
"""

from __future__ import annotations

from dataclasses import dataclass

MODELED_COMM = "modeled_comm_s"
"""The scalar of an emulated run's modeled communication in a step (seconds)."""


@dataclass(frozen=True)
class StepNumbers:
    """One step as its console lines show it."""

    iteration: int
    train_iters: int
    loss: float
    step_time_s: float
    tokens_per_s: float | None
    tflops_per_gpu: float | None
    peak_memory_gib: float
    eta_s: float
    on_gpu: bool
    """TFLOP/s per GPU is shown only where the run is on GPUs (a CPU's is no figure)."""


def _seconds(value: float) -> str:
    return f"{value * 1e3:.1f} ms" if value < 10 else f"{value:.1f} s"


def _count(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value / 1e6:.1f}M" if value >= 1e7 else f"{value:,.0f}"


def _duration(seconds: float) -> str:
    """``42 s``, ``12m05s``, ``3h25m``."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _tflops(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}" if value >= 1 else f"{value:.3f}"


def short_line(step: StepNumbers, scalars: dict[str, float]) -> str:
    """The default console line."""
    parts = [
        f"iteration {step.iteration:>6d}/{step.train_iters}",
        f"loss {step.loss:.4f}",
        f"step {_seconds(step.step_time_s)}",
        f"tokens/s {_count(step.tokens_per_s)}",
    ]
    if step.on_gpu:
        parts.append(f"TFLOP/s/GPU {_tflops(step.tflops_per_gpu)}")
    parts.append(f"mem {step.peak_memory_gib:.2f} GiB")
    if MODELED_COMM in scalars:
        parts.append(f"comm {_seconds(scalars[MODELED_COMM])} modeled")
    parts.append(f"ETA {_duration(step.eta_s)}")
    return " | ".join(parts)


def full_line(step: StepNumbers, scalars: dict[str, float], done_this_run: int) -> str:
    """Every value of the step, for ``verbose`` and the harness's ``launch.log``."""
    extras = "".join(f" | {k} {v:.4g}" for k, v in scalars.items())
    return (
        f"iteration {step.iteration:>6d}/{step.train_iters} ({100.0 * step.iteration / step.train_iters:5.1f}%)"
        f" | loss {step.loss:.6f} | step time {step.step_time_s * 1e3:.1f} ms"
        f" | tokens/s {_count(step.tokens_per_s)} | TFLOP/s/GPU {_tflops(step.tflops_per_gpu)}"
        f" | peak mem {step.peak_memory_gib:.2f} GiB{extras} | ETA {_duration(step.eta_s)}"
        f" ({done_this_run} done this run)"
    )
