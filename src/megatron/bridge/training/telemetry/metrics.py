"""Per-iteration console lines, progress, ``summary.json``, the loss curve and optional TensorBoard
events (rank 0).

The steady-state window is 1-based and inclusive; unless ``logger.steady_state_window`` sets it,
it follows the run (``steady_window.py``: the first max(2, 10 %) steps are warm-up, with one-off
costs such as allocator growth, first touches and compilation). Where no harness reports for the
run (a user's own ``pretrain()`` script), the logging rank ends with the Results table.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker

from megatron.bridge.training.telemetry.loss_plot import write_loss_plot
from megatron.bridge.training.telemetry.results_table import format_results, harness_reports, run_kind
from megatron.bridge.training.telemetry.steady_window import SteadyWindow
from megatron.bridge.training.telemetry.step_lines import StepNumbers, full_line, short_line
from megatron.bridge.utils.owned_files import describe_os_error, make_dir, replace_file
from megatron.bridge.utils.plots import MISSING as PLOTS_MISSING
from megatron.bridge.utils.quiet import MARK_ENV, mark_lines


def steady_state_stats(step_times_s: Sequence[float], window: Sequence[int] | None) -> dict[str, Any]:
    """Mean/min/max/stdev step time over iterations ``window[0]..window[1]`` (1-based, inclusive).

    When the run is shorter than the window, the window is clipped to the iterations that exist;
    when it does not reach the window's start, every iteration after the first is used (all of
    them for a one-iteration run). ``steady_state_window`` reports the window actually used.
    """
    n = len(step_times_s)
    if n == 0 or window is None:
        return dict(
            steady_state_window=list(window) if window is not None else None,
            steady_state_mean_s=None,
            steady_state_min_s=None,
            steady_state_max_s=None,
            steady_state_stdev_s=None,
        )
    first, last = int(window[0]), int(window[1])
    if first < 1 or last < first:
        raise ValueError(f"steady_state_window must be [first, last] with 1 <= first <= last, got {list(window)}")
    last = min(last, n)
    if first > last:
        first, last = (2, n) if n > 1 else (1, 1)
    chosen = list(step_times_s[first - 1 : last])
    return dict(
        steady_state_window=[first, last],
        steady_state_mean_s=statistics.fmean(chosen),
        steady_state_min_s=min(chosen),
        steady_state_max_s=max(chosen),
        steady_state_stdev_s=statistics.pstdev(chosen) if len(chosen) > 1 else 0.0,
    )


def throughput(
    step_time_s: float | None, tokens_per_step: int, flops_per_step: float | None, world_size: int
) -> dict[str, float | None]:
    """Tokens/s for the whole job and model TFLOP/s per GPU at ``step_time_s`` (``None`` where the
    model's FLOPs are not counted, ``telemetry.flops``)."""
    if not step_time_s or step_time_s <= 0:
        return dict(tokens_per_s=None, tflops_per_gpu=None)
    return dict(
        tokens_per_s=tokens_per_step / step_time_s,
        tflops_per_gpu=flops_per_step / step_time_s / world_size / 1e12 if flops_per_step is not None else None,
    )


def moe_aux_losses(model_cfg: Any, num_microbatches: int, iteration: int) -> dict[str, float]:
    """megatron's MoE metrics tracker (load-balancing and z-losses), reduced across ranks and cleared
    for the next step; empty for dense models."""
    if not model_cfg.num_moe_experts:
        return {}

    totals: dict[str, Any] = {}
    get_moe_metrics_tracker().report(
        loss_scale=1.0 / num_microbatches,
        iteration=iteration,
        total_loss_dict=totals,
        num_layers=model_cfg.num_layers,
        moe_layer_freq=model_cfg.moe_layer_freq,
        mtp_num_layers=model_cfg.mtp_num_layers,
    )
    return {k.replace(" ", "_"): float(v) for k, v in totals.items()}


def peak_memory_gib(device: str) -> float:
    """Peak allocated accelerator memory (GiB); on CPU the process's peak resident set size."""
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kib / 2**20


def default_log_dir(name: str = "") -> str:
    """``runs/[<name>_]<YYYYmmdd_HHMMSS>_<token>`` under the current directory: where a run without
    ``logger.log_dir`` writes (the harness passes the recipe's name). The random token makes every
    run's name its own, also for runs started in the same second."""
    stamp = f"{time.strftime('%Y%m%d_%H%M%S')}_{secrets.token_hex(3)}"
    return os.path.abspath(os.path.join("runs", f"{name}_{stamp}" if name else stamp))


def open_tensorboard(log_dir: str) -> Any:
    """A TensorBoard ``SummaryWriter``; a clear error when the package is missing."""
    try:
        # Deferred: tensorboard is optional.
        from torch.utils.tensorboard import SummaryWriter
    except (ImportError, ModuleNotFoundError) as exc:
        raise RuntimeError(
            "logger.tensorboard=true needs the 'tensorboard' package, which is not installed: "
            "install it (uv sync --extra tensorboard) or set logger.tensorboard=false."
        ) from exc
    return SummaryWriter(log_dir=log_dir)


@dataclass
class MetricsLogger:
    """Collects per-iteration metrics; prints and writes only on the logging rank."""

    train_iters: int
    tokens_per_step: int
    flops_per_step: float | None
    world_size: int
    device: str
    log_dir: str
    steady_state_window: SteadyWindow | None = None
    """How the steady-state window is chosen (``None``: automatically, ``steady_window.py``)."""
    log_interval: int = 1
    is_logging_rank: bool = True
    tensorboard: bool = False
    tensorboard_dir: str | None = None
    """Where TensorBoard events go; ``None``: ``log_dir``."""
    start_iteration: int = 0
    verbose: bool = False
    """Print every step's full line instead of the short one (``step_lines.py``)."""
    step_times_s: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    iterations: list[int] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)
    _writer: Any = None
    _t0: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        if not isinstance(self.steady_state_window, SteadyWindow):  # None, or a window given as [first, last]
            given = self.steady_state_window
            self.steady_state_window = SteadyWindow(set_to=tuple(given) if given is not None else None)
        if self.is_logging_rank:
            make_dir(self.log_dir, parents=True)
            if self.tensorboard:
                self._writer = open_tensorboard(str(make_dir(self.tensorboard_dir or self.log_dir, parents=True)))

    def record(self, iteration: int, loss: float, step_time_s: float, **scalars: float) -> None:
        """Store one iteration; print its line (and progress) every ``log_interval`` iterations."""
        self.iterations.append(iteration)
        self.losses.append(loss)
        self.step_times_s.append(step_time_s)
        for key, value in scalars.items():
            self.extra.setdefault(key, []).append(value)
        if not self.is_logging_rank:
            return
        tp = throughput(step_time_s, self.tokens_per_step, self.flops_per_step, self.world_size)
        mem = peak_memory_gib(self.device)
        if self._writer is not None:
            self._writer.add_scalar("lm loss", loss, iteration)
            self._writer.add_scalar("step time (s)", step_time_s, iteration)
            self._writer.add_scalar("tokens per s", tp["tokens_per_s"], iteration)
            if tp["tflops_per_gpu"] is not None:
                self._writer.add_scalar("TFLOP/s per GPU", tp["tflops_per_gpu"], iteration)
            for key, value in scalars.items():
                self._writer.add_scalar(key, value, iteration)
        self.extra.setdefault("peak_memory_gib", []).append(mem)
        if iteration % self.log_interval and iteration != self.train_iters:
            return
        step = StepNumbers(
            iteration=iteration,
            train_iters=self.train_iters,
            loss=loss,
            step_time_s=step_time_s,
            tokens_per_s=tp["tokens_per_s"],
            tflops_per_gpu=tp["tflops_per_gpu"],
            peak_memory_gib=mem,
            eta_s=statistics.fmean(self.step_times_s[-5:]) * (self.train_iters - iteration),
            on_gpu=self.device != "cpu",
        )
        full = full_line(step, scalars, done_this_run=iteration - self.start_iteration)
        print(full if self.verbose else short_line(step, scalars), flush=True)
        if os.environ.get(MARK_ENV) == "1" and not self.verbose:  # launch.log keeps it, the console not
            print(mark_lines(full), flush=True)

    def summary(self, **context: Any) -> dict[str, Any]:
        """The ``summary.json`` content: raw series, steady-state statistics and ``context``."""
        window, rule = self.steady_state_window.choose(len(self.step_times_s))
        stats = steady_state_stats(self.step_times_s, window)
        stats["steady_state_rule"] = rule
        first, last = stats["steady_state_window"] or (1, 0)
        timed = self.iterations[first - 1 : last]
        # After a resume the window's steps are not its iteration numbers: record both.
        stats["steady_state_iterations"] = [timed[0], timed[-1]] if timed else None
        tp = throughput(stats["steady_state_mean_s"], self.tokens_per_step, self.flops_per_step, self.world_size)
        return {
            "iterations": self.iterations,
            "step_times_s": self.step_times_s,
            "losses": self.losses,
            **stats,
            **tp,
            "tokens_per_step": self.tokens_per_step,
            "model_flops_per_step": self.flops_per_step,
            "peak_memory_gib": peak_memory_gib(self.device),
            "world_size": self.world_size,
            "device": self.device,
            # the last logged loss as it was: a NaN stops the run (finite_state.py) and is the final loss
            "final_loss": self.losses[-1] if self.losses else None,
            "extra": self.extra,
            "wall_time_s": time.perf_counter() - self._t0,
            **context,
        }

    def write_summary(self, **context: Any) -> Path | None:
        """Write ``summary.json`` and the loss curve in ``log_dir`` (logging rank only); returns the
        summary's path, or ``None`` when it could not be written (said in one line: the run's result
        is not lost for that). Ends with the Results table unless the harness prints it."""
        if not self.is_logging_rank:
            return None
        path = Path(self.log_dir) / "summary.json"
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
        summary = self.summary(**context)
        summary["loss_plot"] = self._loss_plot(summary)
        try:
            replace_file(path, json.dumps(summary, indent=2, default=str))
        except OSError as exc:
            print(f"could not write {path}: {describe_os_error(exc, path)}", file=sys.stdout, flush=True)
            return None
        if harness_reports():
            print(f"summary written to {path}", file=sys.stdout, flush=True)
        else:
            print(format_results(summary, path), file=sys.stdout, flush=True)
        return path

    def _loss_plot(self, summary: dict[str, Any]) -> str | None:
        """Draw ``loss.png`` and say where, or say in one line why there is none."""
        title = f"{Path(self.log_dir).name} ({run_kind(summary)})"
        try:
            plot = write_loss_plot(
                self.log_dir,
                self.iterations,
                self.losses,
                self.step_times_s,
                summary.get("steady_state_window"),
                title,
                self.extra.get("modeled_comm_s", ()),
            )
        except OSError as exc:
            print(f"no loss curve: {describe_os_error(exc, Path(self.log_dir))}", flush=True)
            return None
        if plot is None:
            if self.step_times_s:
                print(f"no loss curve: {PLOTS_MISSING}", flush=True)
            return None
        print(f"loss curve: {plot}", flush=True)
        return str(plot)
