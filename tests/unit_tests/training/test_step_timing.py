"""Per-step phase timing without extra synchronisation."""

import time

import pytest

from megatron.bridge.training.telemetry.step_timing import StepTimer


def test_cpu_timer_reports_the_host_launch_time_only():
    timer = StepTimer(use_cuda=False)
    timer.start()
    time.sleep(0.01)
    timer.forward_backward_launched()
    phases = timer.stop()
    assert set(phases) == {"host_fwd_bwd_s"}
    assert phases["host_fwd_bwd_s"] >= 0.009


class _Clock:
    """A stand-in GPU timeline: events read it, sleeps and 'kernels' advance it."""

    def __init__(self):
        self.now = 0.0

    def event_class(self):
        clock = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = clock.now

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return (other.t - self.t) * 1e3

        return Event


def test_parked_step_separates_the_sleep_from_the_forward_backward(monkeypatch):
    """The park is a sleep kernel queued before the forward+backward; ``gpu_work_s`` is what follows."""
    import torch

    from megatron.bridge.training.telemetry import step_timing

    clock = _Clock()
    monkeypatch.setattr(torch.cuda, "Event", clock.event_class())
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: setattr(clock, "now", clock.now + cycles / 2e9))
    monkeypatch.setattr(step_timing, "_sleep_cycles_per_second", lambda: 2e9)
    timer = StepTimer(use_cuda=False)
    timer.use_cuda = True  # a GPU timeline without a GPU
    timer.start(park_s=0.5)
    clock.now += 0.3  # the forward+backward's kernels
    timer.forward_backward_launched()
    clock.now += 0.04  # the optimizer
    phases = timer.stop()
    assert phases["gpu_parked_s"] == pytest.approx(0.5)
    assert phases["gpu_work_s"] == pytest.approx(0.3)
    assert phases["gpu_fwd_bwd_s"] == pytest.approx(0.8) and phases["gpu_optimizer_s"] == pytest.approx(0.04)
    timer.start()  # an ordinary step reports no park
    timer.forward_backward_launched()
    assert "gpu_work_s" not in timer.stop()
