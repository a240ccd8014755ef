"""Where a training step's time goes: forward+backward versus the optimizer, host versus GPU.

CUDA events are recorded on the current stream before the forward+backward, between it and the
optimizer, and at the end of the step; they are read after the step's closing synchronisation, so
timing adds no synchronisation of its own. Next to them, the host's own time for launching the
forward+backward. When the host needs about as long to launch the forward+backward as the GPU
takes to run it (``host_fwd_bwd_s`` close to ``gpu_fwd_bwd_s``), the GPU waited for the host: the
step is host-bound and faster kernels will not shorten it.
"""

from __future__ import annotations

import time
from typing import Optional

import torch


class StepTimer:
    """Phase times of one step (seconds): ``host_fwd_bwd_s`` and, on CUDA, ``gpu_fwd_bwd_s`` and
    ``gpu_optimizer_s``."""

    def __init__(self, use_cuda: bool) -> None:
        self.use_cuda = use_cuda and torch.cuda.is_available()
        self._events: list = []
        self._host_start: Optional[float] = None
        self._host_fwd_bwd: Optional[float] = None

    def _mark(self) -> None:
        if self.use_cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._events.append(event)

    def start(self) -> None:
        """Before the forward+backward."""
        self._events = []
        self._mark()
        self._host_start = time.perf_counter()

    def forward_backward_launched(self) -> None:
        """After the forward+backward call returned (its work may still run on the GPU)."""
        self._host_fwd_bwd = time.perf_counter() - self._host_start
        self._mark()

    def stop(self) -> dict[str, float]:
        """After the optimizer step and the step's closing synchronisation."""
        self._mark()
        phases = {"host_fwd_bwd_s": self._host_fwd_bwd}
        if self.use_cuda:
            start, middle, end = self._events
            phases["gpu_fwd_bwd_s"] = start.elapsed_time(middle) / 1e3
            phases["gpu_optimizer_s"] = middle.elapsed_time(end) / 1e3
        return phases
