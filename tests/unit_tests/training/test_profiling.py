"""The step profiler captures exactly the configured window on the configured ranks."""

import json

import pytest
import torch

from megatron.bridge.training.config import ProfilingConfig
from megatron.bridge.training.telemetry.profiling import StepProfiler


def _run_steps(profiler: StepProfiler, steps: int):
    written = []
    for iteration in range(1, steps + 1):
        profiler.before_step(iteration)
        with torch.profiler.record_function(f"train_step_{iteration}"):
            torch.randn(64, 64) @ torch.randn(64, 64)
        path = profiler.after_step(iteration)
        if path is not None:
            written.append(path)
    profiler.close()
    return written


def test_trace_covers_the_window_with_step_markers(tmp_path):
    cfg = ProfilingConfig(use_pytorch_profiler=True, profile_step_start=2, profile_step_end=3, profile_ranks=[0])
    written = _run_steps(StepProfiler(cfg, rank=0, log_dir=str(tmp_path), use_cuda=False), steps=5)
    assert written == [tmp_path / "profile" / "trace_rank0_steps2-3.json"]
    names = {e.get("name", "") for e in json.loads(written[0].read_text())["traceEvents"]}
    assert {"train_step_2", "train_step_3"} <= names
    assert not {"train_step_1", "train_step_4"} & names
    assert any(n.startswith("ProfilerStep#") for n in names)


@pytest.mark.parametrize(
    "enabled, ranks, rank",
    [(False, [0], 0), (True, [1], 0)],
)
def test_nothing_is_captured_when_disabled_or_on_other_ranks(tmp_path, enabled, ranks, rank):
    cfg = ProfilingConfig(use_pytorch_profiler=enabled, profile_step_start=1, profile_step_end=2, profile_ranks=ranks)
    assert _run_steps(StepProfiler(cfg, rank=rank, log_dir=str(tmp_path), use_cuda=False), steps=3) == []
    assert not (tmp_path / "profile").exists()


def test_run_ending_inside_the_window_still_writes_the_trace(tmp_path):
    cfg = ProfilingConfig(use_pytorch_profiler=True, profile_step_start=2, profile_step_end=9, profile_ranks=[0])
    profiler = StepProfiler(cfg, rank=0, log_dir=str(tmp_path), use_cuda=False)
    assert _run_steps(profiler, steps=3) == []
    assert profiler.trace_path.is_file()
