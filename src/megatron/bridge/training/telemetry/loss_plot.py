"""``loss.png`` beside ``summary.json``: the loss and the step time of every step of the run, the
steady-state window shaded, so a run's curve is one look away without TensorBoard."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from megatron.bridge.utils.plots import fit_width, pyplot, save_png

PLOT_NAME = "loss.png"


def write_loss_plot(
    log_dir: str | Path,
    iterations: Sequence[int],
    losses: Sequence[float],
    step_times_s: Sequence[float],
    window: Sequence[int] | None,
    title: str,
    modeled_comm_s: Sequence[float] = (),
) -> Path | None:
    """Draw the run's curves into ``<log_dir>/loss.png``; ``None`` when matplotlib is not installed
    or no step ran. ``window`` is the steady-state window in steps of this run (1-based);
    ``modeled_comm_s``: an emulated run's modeled communication per step, drawn under its step time."""
    plt = pyplot()
    if plt is None or not iterations:
        return None
    fig, (loss_ax, time_ax) = plt.subplots(2, 1, sharex=True, figsize=(6.4, 4.8))
    loss_ax.plot(iterations, losses, color="#4c72b0", marker="." if len(iterations) <= 50 else None)
    loss_ax.set_ylabel("loss")
    time_ax.plot(iterations, step_times_s, color="#dd8452", marker="." if len(iterations) <= 50 else None)
    if len(modeled_comm_s) == len(iterations):
        time_ax.plot(iterations, modeled_comm_s, color="#55a868", ls="--", label="of which modeled communication")
        time_ax.legend(fontsize=8, loc="upper right")
    time_ax.set_ylabel("step time (s)")
    time_ax.set_xlabel("iteration")
    if window is not None:
        first, last = iterations[window[0] - 1], iterations[min(window[1], len(iterations)) - 1]
        for ax in (loss_ax, time_ax):
            ax.axvspan(first - 0.5, last + 0.5, color="#999999", alpha=0.15, lw=0)
        time_ax.annotate(
            "steady-state window",
            (first - 0.5, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -3),
            textcoords="offset points",
            va="top",
            fontsize=8,
            color="#555555",
        )
    heading = fig.suptitle(title, fontsize=10)
    fit_width(fig, [heading])
    return save_png(fig, Path(log_dir) / PLOT_NAME)
