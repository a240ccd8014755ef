"""Per-step phase timing without extra synchronisation."""

import time

from megatron.bridge.training.step_timing import StepTimer


def test_cpu_timer_reports_the_host_launch_time_only():
    timer = StepTimer(use_cuda=False)
    timer.start()
    time.sleep(0.01)
    timer.forward_backward_launched()
    phases = timer.stop()
    assert set(phases) == {"host_fwd_bwd_s"}
    assert phases["host_fwd_bwd_s"] >= 0.009
