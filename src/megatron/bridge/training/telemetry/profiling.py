"""torch profiler capture of a window of training steps on chosen ranks (``cfg.profiling``).

The trace is a Chrome trace (``trace_rank<R>_steps<S>-<E>.json``) in ``<log_dir>/profile/``, with a
``ProfilerStep#N`` range per captured step, which ``scripts/performance/analyze_overlap.py`` reads
to measure how much of the MoE dispatch/combine communication is hidden under compute.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from megatron.bridge.utils.owned_files import make_dir, remove

if TYPE_CHECKING:
    from megatron.bridge.training.config import ProfilingConfig


class StepProfiler:
    """Starts before step ``profile_step_start`` and stops after ``profile_step_end`` (1-based)."""

    def __init__(self, cfg: ProfilingConfig, rank: int, log_dir: str, use_cuda: bool) -> None:
        self.cfg = cfg
        self.rank = rank
        self.active = cfg.use_pytorch_profiler and rank in cfg.profile_ranks
        self.trace_path = (
            Path(log_dir) / "profile" / (f"trace_rank{rank}_steps{cfg.profile_step_start}-{cfg.profile_step_end}.json")
        )
        self._profiler: torch.profiler.profile | None = None
        activities = [torch.profiler.ProfilerActivity.CPU]
        if use_cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._activities = activities

    def before_step(self, iteration: int) -> None:
        """Call with the 1-based number of the step about to run."""
        if self.active and iteration == self.cfg.profile_step_start and self._profiler is None:
            steps = self.cfg.profile_step_end - self.cfg.profile_step_start + 1
            # A schedule makes the profiler mark each step with a ``ProfilerStep#N`` range.
            self._profiler = torch.profiler.profile(
                activities=self._activities,
                record_shapes=self.cfg.record_shapes,
                schedule=torch.profiler.schedule(wait=0, warmup=0, active=steps, repeat=1),
            )
            self._profiler.start()

    def after_step(self, iteration: int) -> Path | None:
        """Call with the 1-based number of the step that just ended; returns the trace when written."""
        if self._profiler is None:
            return None
        self._profiler.step()
        if iteration >= self.cfg.profile_step_end:
            return self.close()
        return None

    def close(self) -> Path | None:
        """Stop a running capture (also when training ends early) and write the trace."""
        if self._profiler is None:
            return None
        self._profiler.stop()
        self._export()
        self._profiler = None
        return self.trace_path

    def _export(self) -> None:
        """Write the trace in a fresh private directory and rename it into place: torch's exporter
        opens its path plainly, which must never meet a name someone else planted."""
        folder = make_dir(self.trace_path.parent, parents=True)
        staging = Path(tempfile.mkdtemp(prefix=".trace.", dir=folder))
        try:
            self._profiler.export_chrome_trace(str(staging / self.trace_path.name))
            os.replace(staging / self.trace_path.name, self.trace_path)
        finally:
            remove(staging)
