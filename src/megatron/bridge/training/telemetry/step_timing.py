"""Where a training step's time goes: forward+backward versus the optimizer, host versus GPU.

CUDA events are recorded on the current stream before the forward+backward, between it and the
optimizer, and at the end of the step; they are read after the step's closing synchronisation, so
timing adds no synchronisation of its own. Next to them, the host's own time for launching the
forward+backward (``host_fwd_bwd_s``).

``host_fwd_bwd_s`` close to ``gpu_fwd_bwd_s`` does not by itself mean the step is host-bound: any
synchronisation inside the forward+backward makes the host wait for the GPU (megatron-core's DDP
checks the gradients for NaN when it starts the gradient reduction, and that check reads a GPU
value). Parked steps (``profiling.gpu_park_steps``) answer the question: the GPU first runs a
sleep kernel long enough for the host to queue the whole forward+backward, so the GPU time after
the sleep (``gpu_work_s``) is the forward+backward with the host out of the way. If it is about
``gpu_fwd_bwd_s`` of normal steps the GPU is the bottleneck; the difference is what the host costs.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import torch


@functools.cache
def _sleep_cycles_per_second() -> float:
    """Clock rate of ``torch.cuda._sleep`` on this GPU, measured once per process."""
    cycles = 50_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)  # warm-up
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) / 1e3)


def park_gpu(seconds: float) -> None:
    """Enqueue a sleep kernel of about ``seconds`` on the current stream: work the host queues
    behind it waits, so the host's own time for queueing shows without the GPU in the way."""
    torch.cuda._sleep(int(seconds * _sleep_cycles_per_second()))


def host_enqueue_s(fn: Callable[[], object], calls: int, park_s: float) -> tuple[float, bool]:
    """The host's seconds per ``fn()`` with the GPU parked for ``park_s``, and whether the host
    waited for the GPU (took about as long as the park: something in ``fn`` synchronised).

    ``calls`` x the kernels of one call must stay below CUDA's launch queue depth (about a
    thousand), or a full queue makes the host wait as a synchronisation would.
    """
    torch.cuda.synchronize()
    park_gpu(park_s)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls, elapsed > 0.9 * park_s


class StepTimer:
    """Phase times of one step (seconds): ``host_fwd_bwd_s`` and, on CUDA, ``gpu_fwd_bwd_s`` and
    ``gpu_optimizer_s``; on parked steps also ``gpu_parked_s`` and ``gpu_work_s``."""

    def __init__(self, use_cuda: bool) -> None:
        self.use_cuda = use_cuda and torch.cuda.is_available()
        self._events: list = []
        self._park_events: tuple | None = None
        self._host_start: float | None = None
        self._host_fwd_bwd: float | None = None

    def _mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self, park_s: float = 0.0) -> None:
        """Before the forward+backward; ``park_s`` > 0 first holds the GPU that long (CUDA only)."""
        self._events, self._park_events = [], None
        if self.use_cuda:
            self._events.append(self._mark())
            if park_s > 0:
                park_gpu(park_s)
                self._park_events = (self._events[0], self._mark())
        self._host_start = time.perf_counter()

    def forward_backward_launched(self) -> None:
        """After the forward+backward call returned (its work may still run on the GPU)."""
        self._host_fwd_bwd = time.perf_counter() - self._host_start
        if self.use_cuda:
            self._events.append(self._mark())

    def stop(self) -> dict[str, float]:
        """After the optimizer step and the step's closing synchronisation."""
        phases = {"host_fwd_bwd_s": self._host_fwd_bwd}
        if self.use_cuda:
            self._events.append(self._mark())
            self._events[-1].synchronize()
            start, middle, end = self._events
            phases["gpu_fwd_bwd_s"] = start.elapsed_time(middle) / 1e3
            phases["gpu_optimizer_s"] = middle.elapsed_time(end) / 1e3
            if self._park_events is not None:
                parked_start, parked_end = self._park_events
                phases["gpu_parked_s"] = parked_start.elapsed_time(parked_end) / 1e3
                phases["gpu_work_s"] = parked_end.elapsed_time(middle) / 1e3
        return phases
