"""The step profiler captures exactly the configured window on the configured ranks."""

import json
import pstats

import pytest
import torch

from megatron.bridge.training.config import ProfilingConfig
from megatron.bridge.training.telemetry.host_profile import package_of
from megatron.bridge.training.telemetry.profiling import StepProfiler


def _run_steps(profiler: StepProfiler, steps: int):
    written = []
    for iteration in range(1, steps + 1):
        profiler.before_step(iteration)
        with torch.profiler.record_function(f"train_step_{iteration}"):
            torch.randn(64, 64) @ torch.randn(64, 64)
        written.extend(profiler.after_step(iteration))
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


def _host_cfg(**fields) -> ProfilingConfig:
    return ProfilingConfig(**{"use_host_profiler": True, "profile_ranks": [0], **fields})


def test_host_profile_counts_the_window_only(tmp_path):
    profiler = StepProfiler(
        _host_cfg(profile_step_start=2, profile_step_end=3), rank=0, log_dir=str(tmp_path), use_cuda=False
    )
    written = _run_steps(profiler, steps=5)
    assert written == [tmp_path / "profile" / "host_rank0_steps2-3.txt"]
    stats = pstats.Stats(str(tmp_path / "profile" / "host_rank0_steps2-3.pstats"))
    randn_calls = [row[0] for (_file, _line, name), row in stats.stats.items() if "randn" in name]
    assert randn_calls == [4]  # steps 2 and 3 of 5, two torch.randn calls each
    report = written[0].read_text()
    assert report.startswith("host time of 2 step(s) under cProfile")
    assert "C functions (torch ops, CUDA calls, builtins)" in report


def test_host_profile_of_a_run_ending_inside_the_window_counts_the_steps_run(tmp_path):
    profiler = StepProfiler(
        _host_cfg(profile_step_start=2, profile_step_end=9), rank=0, log_dir=str(tmp_path), use_cuda=False
    )
    for iteration in (1, 2, 3):
        profiler.before_step(iteration)
        assert profiler.after_step(iteration) == []
    report = tmp_path / "profile" / "host_rank0_steps2-9.txt"
    assert profiler.close(last_step=3) == [report]
    assert report.read_text().startswith("host time of 2 step(s)")


def test_both_profilers_write_their_files(tmp_path):
    cfg = _host_cfg(use_pytorch_profiler=True, profile_step_start=1, profile_step_end=1)
    written = _run_steps(StepProfiler(cfg, rank=0, log_dir=str(tmp_path), use_cuda=False), steps=2)
    assert [p.name for p in written] == ["host_rank0_steps1-1.txt", "trace_rank0_steps1-1.json"]


@pytest.mark.parametrize(
    "filename, package",
    [
        ("~", "C functions (torch ops, CUDA calls, builtins)"),
        (
            "/x/site-packages/megatron/core/transformer/moe/token_dispatcher.py",
            "megatron-core MoE (router, dispatcher, experts)",
        ),
        ("/x/site-packages/megatron/core/parallel_state.py", "megatron-core (other)"),
        ("/x/src/megatron/bridge/emulation/backend.py", "emulated world (backend, hold kernel)"),
        ("/x/src/megatron/bridge/training/loop/trainer.py", "megatron.bridge (other)"),
        ("/x/site-packages/triton/runtime/jit.py", "Triton (kernel launches)"),
        ("/x/site-packages/torch/nn/modules/module.py", "torch (Python)"),
        ("/usr/lib/python3.12/functools.py", "other Python"),
    ],
)
def test_functions_are_summed_by_package(filename, package):
    assert package_of(filename) == package
