"""Profiles of a window of training steps on chosen ranks (``cfg.profiling``), in ``<log_dir>/profile/``.

* ``use_pytorch_profiler``: a Chrome trace (``trace_rank<R>_steps<S>-<E>.json``) with a
  ``ProfilerStep#N`` range per captured step, which ``scripts/performance/analyze_overlap.py`` reads
  to measure how much of the MoE dispatch/combine communication is hidden under compute;
* ``use_host_profiler``: where the host's time went, every call counted (:mod:`host_profile`:
  ``host_rank<R>_steps<S>-<E>.pstats`` and its ``.txt`` report).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from megatron.bridge.training.telemetry.host_profile import HostProfile
from megatron.bridge.utils.owned_files import make_dir, remove

if TYPE_CHECKING:
    from megatron.bridge.training.config import ProfilingConfig


class StepProfiler:
    """Starts before step ``profile_step_start`` and stops after ``profile_step_end`` (1-based)."""

    def __init__(self, cfg: ProfilingConfig, rank: int, log_dir: str, use_cuda: bool) -> None:
        self.cfg = cfg
        self.rank = rank
        on_rank = rank in cfg.profile_ranks
        self.active = cfg.use_pytorch_profiler and on_rank
        self.host_active = cfg.use_host_profiler and on_rank
        window = f"rank{rank}_steps{cfg.profile_step_start}-{cfg.profile_step_end}"
        self.trace_path = Path(log_dir) / "profile" / f"trace_{window}.json"
        self.host_path = Path(log_dir) / "profile" / f"host_{window}.pstats"
        self._profiler: torch.profiler.profile | None = None
        self._host: HostProfile | None = None
        self._host_first = 0
        activities = [torch.profiler.ProfilerActivity.CPU]
        if use_cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._activities = activities

    def before_step(self, iteration: int) -> None:
        """Call with the 1-based number of the step about to run."""
        if self.host_active and iteration == self.cfg.profile_step_start and self._host is None:
            self._host, self._host_first = HostProfile(), iteration
            self._host.start()
        if self.active and iteration == self.cfg.profile_step_start and self._profiler is None:
            steps = self.cfg.profile_step_end - self.cfg.profile_step_start + 1
            # A schedule makes the profiler mark each step with a ``ProfilerStep#N`` range.
            self._profiler = torch.profiler.profile(
                activities=self._activities,
                record_shapes=self.cfg.record_shapes,
                schedule=torch.profiler.schedule(wait=0, warmup=0, active=steps, repeat=1),
            )
            self._profiler.start()

    def after_step(self, iteration: int) -> list[Path]:
        """Call with the 1-based number of the step that just ended; returns what was written."""
        if self._profiler is not None:
            self._profiler.step()
        if iteration >= self.cfg.profile_step_end:
            return self.close(iteration)
        return []

    def close(self, last_step: int | None = None) -> list[Path]:
        """Stop running captures (also when training ends early, after ``last_step``) and write them:
        the host report first (the torch profiler's export is host time it must not count)."""
        written = []
        if self._host is not None:
            self._host.stop()
            steps = (last_step or self.cfg.profile_step_end) - self._host_first + 1
            written.append(self._host.write(self.host_path, steps))
            self._host = None
        if self._profiler is not None:
            self._profiler.stop()
            self._export()
            self._profiler = None
            written.append(self.trace_path)
        return written

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
