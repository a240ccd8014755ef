"""Per-iteration console lines, progress, ``summary.json`` and optional TensorBoard events (rank 0).

The steady-state window is 1-based and inclusive (iterations 3-8 by default, Megatron-Bridge's
method): early iterations include one-off costs (allocator warm-up, first-touch, compile).
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker

from megatron.bridge.utils.owned_files import describe_os_error, make_dir, replace_file


def steady_state_stats(step_times_s: Sequence[float], window: Sequence[int]) -> dict[str, Any]:
    """Mean/min/max/stdev step time over iterations ``window[0]..window[1]`` (1-based, inclusive).

    When the run is shorter than the window, the window is clipped to the iterations that exist;
    when it does not reach the window's start, every iteration after the first is used (all of
    them for a one-iteration run). ``steady_state_window`` reports the window actually used.
    """
    n = len(step_times_s)
    if n == 0:
        return dict(
            steady_state_window=list(window), steady_state_mean_s=None, steady_state_min_s=None,
            steady_state_max_s=None, steady_state_stdev_s=None,
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


def throughput(step_time_s: Optional[float], tokens_per_step: int, flops_per_step: Optional[float],
               world_size: int) -> dict[str, Optional[float]]:
    """Tokens/s for the whole job and model TFLOP/s per GPU at ``step_time_s`` (``None`` where the
    model's FLOPs are not counted, ``telemetry.flops``)."""
    if not step_time_s or step_time_s <= 0:
        return dict(tokens_per_s=None, tflops_per_gpu=None)
    return dict(
        tokens_per_s=tokens_per_step / step_time_s,
        tflops_per_gpu=flops_per_step / step_time_s / world_size / 1e12 if flops_per_step is not None else None,
    )


def _tflops_text(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.3f}"


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
    flops_per_step: Optional[float]
    world_size: int
    device: str
    log_dir: str
    steady_state_window: Sequence[int] = (3, 8)
    log_interval: int = 1
    is_logging_rank: bool = True
    tensorboard: bool = False
    tensorboard_dir: Optional[str] = None
    """Where TensorBoard events go; ``None``: ``log_dir``."""
    start_iteration: int = 0
    step_times_s: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    iterations: list[int] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)
    _writer: Any = None
    _t0: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
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
        if iteration % self.log_interval and iteration != self.train_iters:
            return
        extras = "".join(f" | {k} {v:.4g}" for k, v in scalars.items())
        done = iteration - self.start_iteration
        todo = self.train_iters - iteration
        eta = statistics.fmean(self.step_times_s[-5:]) * todo
        print(
            f"iteration {iteration:>6d}/{self.train_iters} ({100.0 * iteration / self.train_iters:5.1f}%)"
            f" | loss {loss:.6f} | step time {step_time_s * 1e3:.1f} ms"
            f" | tokens/s {tp['tokens_per_s']:.1f} | TFLOP/s/GPU {_tflops_text(tp['tflops_per_gpu'])}"
            f" | peak mem {mem:.2f} GiB{extras} | ETA {eta:.0f} s ({done} done this run)",
            flush=True,
        )

    def summary(self, **context: Any) -> dict[str, Any]:
        """The ``summary.json`` content: raw series, steady-state statistics and ``context``."""
        stats = steady_state_stats(self.step_times_s, self.steady_state_window)
        first, last = stats["steady_state_window"]
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

    def write_summary(self, **context: Any) -> Optional[Path]:
        """Write ``summary.json`` in ``log_dir`` (logging rank only); returns its path, or ``None``
        when it could not be written (said in one line: the run's result is not lost for that)."""
        if not self.is_logging_rank:
            return None
        path = Path(self.log_dir) / "summary.json"
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
        try:
            replace_file(path, json.dumps(self.summary(**context), indent=2, default=str))
        except OSError as exc:
            print(f"could not write {path}: {describe_os_error(exc, path)}", file=sys.stdout, flush=True)
            return None
        print(f"summary written to {path}", file=sys.stdout, flush=True)
        return path
