"""What the harness and the analysis say is true: a Ctrl-C after a job ended does not claim nothing
was launched; ``recipes/tiny_cpu_smoke.yaml`` is CPU smoke mode with two processes on its own; CPU
timings rank nothing (no sweep speedup, no dispatcher advice); a profiled CPU run's native
"gpuGetDeviceCount failed" line stays out of the console; a file that is not a trace is refused in
words; ``mixed_precision=NAME`` is an override, as the rules' fix texts say."""

from __future__ import annotations

import dataclasses
import io
import json
import signal
import subprocess
import sys
from pathlib import Path

import megatron.bridge.perf.harness.execution as execution_module
import megatron.bridge.perf.harness.run as run_module
from megatron.bridge.perf.harness.launcher import run_plan
from megatron.bridge.perf.harness.supervisor import LAUNCH_LOG, JobOutcome

ROOT = Path(__file__).resolve().parents[3]
CHILDREN = Path(__file__).with_name("children")
ANALYZE = ROOT / "scripts" / "performance" / "analyze_overlap.py"
TINY_CPU = ["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "2", "-ep", "2", "--max_steps", "8"]


def run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    code = run_module.main(argv, out=out)
    return code, out.getvalue()


def _trained(plan, stream=None, verbose=False, stop_signal=None) -> JobOutcome:
    """Stand-in launcher: the ranks trained to iteration 4 and saved, as ``summary.json`` says."""
    (plan.log_dir / "summary.json").write_text(
        json.dumps(
            {
                "step_times_s": [3.0, 2.0, 1.0, 1.0],
                "losses": [7.0, 6.9, 6.8, 6.7],
                "world_size": plan.nprocs,
                "final_iteration": 4,
                "checkpoint": str(plan.log_dir / "ckpt" / "iter_0000004"),
            }
        )
    )
    return JobOutcome(0, stop_signal=stop_signal)


def test_a_ctrl_c_after_the_job_ended_says_what_the_job_did(tmp_path, monkeypatch):
    """The first Ctrl-C stopped the job (it saved at iteration 4); a second one reached the harness
    while it reported. It said "interrupted before launch: nothing was launched"."""
    monkeypatch.setattr(execution_module, "run_plan", lambda plan, **kw: _trained(plan, stop_signal=signal.SIGINT))

    def second_ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt  # what Python's SIGINT handler raises once the job's supervisor is gone

    monkeypatch.setattr(execution_module, "format_results", second_ctrl_c)
    code, out = run([*TINY_CPU, "-l", str(tmp_path / "run")])
    assert code == 130, out
    assert "nothing was launched" not in out and "before launch" not in out, out
    assert "had ended" in out and "ran to iteration 4; checkpoint at" in out and "iter_0000004" in out, out


def test_a_ctrl_c_while_the_config_is_built_says_nothing_was_launched(tmp_path, monkeypatch):
    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_module, "build_config", ctrl_c)
    code, out = run([*TINY_CPU, "-l", str(tmp_path / "run")])
    assert code == 130 and out.strip() == "interrupted before launch: nothing was launched", out


def test_the_cpu_smoke_overlay_is_cpu_smoke_mode_with_two_processes_by_itself(tmp_path):
    """``--config_file recipes/tiny_cpu_smoke.yaml`` without ``-g cpu -ng 2`` (it was refused: the
    layout EP=2 does not divide -ng 1)."""
    code, out = run(
        [
            "-mr",
            "qwen3_moe_tiny",
            "--config_file",
            str(ROOT / "recipes" / "tiny_cpu_smoke.yaml"),
            "--dryrun",
            "-l",
            str(tmp_path / "run"),
        ]
    )
    assert code == 0, out
    assert "2 processes on 1 node(s); world size 2; CPU smoke mode (gloo)" in out, out
    assert "--nproc-per-node=2" in out and "CUDA_VISIBLE_DEVICES=" in out, out
    yaml_text = (ROOT / "recipes" / "tiny_cpu_smoke.yaml").read_text()
    assert "two processes" in yaml_text


def test_a_cpu_sweep_gives_no_speedup(tmp_path, monkeypatch):
    """Step times of a CPU sweep are shown, with why they rank nothing; no "2.039x"."""

    def faster_with_overlap(plan, stream=None, verbose=False):
        step = 0.5 if "comm=true" in str(plan.log_dir) else 1.0
        (plan.log_dir / "summary.json").write_text(
            json.dumps({"step_times_s": [3.0, 2.0] + [step] * 6, "losses": [7.0] * 8, "world_size": plan.nprocs})
        )
        return JobOutcome(0)

    monkeypatch.setattr(execution_module, "run_plan", faster_with_overlap)
    root = tmp_path / "s"
    code, out = run([*TINY_CPU, "-l", str(root), "--sweep", "comm_overlap.overlap_moe_expert_parallel_comm=false,true"])
    assert code == 0, out
    md = (root / "sweep.md").read_text()
    assert "2.000x" not in md and "| `true` | 0.5000 | 0.5000 | 0.5000 | n/a (CPU) |" in md, md
    assert "they rank nothing" in md and "One round per value" in md, md


def _write_cpu_trace(folder: Path) -> Path:
    """A profiled CPU smoke-mode step: CPU ops only (gloo's all-to-all among them), no GPU kernel;
    its run had EP=2 with overlap on (its summary.json)."""
    folder.mkdir(parents=True)
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#5", "ts": 0, "dur": 1000, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 300, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::alltoall_base_", "ts": 300, "dur": 500, "pid": 1, "tid": 1},
    ]
    trace = folder / "rank0_trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    (folder / "summary.json").write_text(
        json.dumps({"parallel_layout": {"ep": 2}, "overlap_report": {"features": {"moe_ep_overlap": {"active": True}}}})
    )
    return trace


def _analyze(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ANALYZE), *map(str, paths)], capture_output=True, text=True, timeout=300, cwd=ROOT
    )


def test_the_analysis_of_a_cpu_trace_ranks_nothing(tmp_path):
    """It recommended a faster dispatcher (DeepEP/HybridEP) from a CPU trace."""
    proc = _analyze(_write_cpu_trace(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    assert "CPU only (no GPU kernels): these timings rank nothing" in proc.stdout, proc.stdout
    decision = proc.stdout.split("decision:", 1)[1]
    assert "ranks nothing" in decision and "DeepEP" not in decision and "turn EP overlap on" not in decision


def test_analyze_overlap_refuses_files_that_are_not_traces_all_at_once(tmp_path):
    """Each named with its reason, exit 2, no traceback (it was a JSONDecodeError)."""
    text = tmp_path / "notes.txt"
    text.write_text("step times: 1.0 s\n")
    other_json = tmp_path / "summary.json"
    other_json.write_text(json.dumps({"step_times_s": [1.0]}))
    not_gzip = tmp_path / "trace.json.gz"
    not_gzip.write_text("{}")
    proc = _analyze(text, other_json, not_gzip, tmp_path / "missing.json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for path, reason in (
        (text, "not JSON"),
        (other_json, "without a traceEvents list"),
        (not_gzip, "not a gzip-compressed trace"),
        (tmp_path / "missing.json", "no such file"),
    ):
        assert f"{path}: " in proc.stderr and reason in proc.stderr, (path, proc.stderr)


def test_a_profiled_cpu_runs_native_profiler_lines_stay_out_of_the_console(tmp_path, monkeypatch):
    """kineto's "gpuGetDeviceCount failed with code 35" (no CUDA driver on a CPU host: expected) and
    its start/stop lines: in launch.log, not on the console (they were, on every profiled CPU run)."""

    def launch_stand_in(plan, stream=None, verbose=False):
        return run_plan(
            dataclasses.replace(plan, argv=[sys.executable, str(CHILDREN / "profiled_cpu_rank.py")]),
            stream=stream,
            verbose=verbose,
        )

    monkeypatch.setattr(execution_module, "run_plan", launch_stand_in)
    log_dir = tmp_path / "run"
    code, out = run(
        [*TINY_CPU, "--profile", "--profile_step_start", "2", "--profile_step_end", "2", "-l", str(log_dir)]
    )
    assert code == 0, out
    assert "iteration      2/2" in out and "gpuGetDeviceCount" not in out and "profiler_start" not in out, out
    log = (log_dir / LAUNCH_LOG).read_text()
    assert "gpuGetDeviceCount failed with code 35" in log and "profiler_stop" in log, log


def test_mixed_precision_is_an_override_as_the_fix_texts_say(tmp_path):
    """``mixed_precision=fp16_mixed`` was refused as not a dotted override."""
    code, out = run([*TINY_CPU, "mixed_precision=fp16_mixed", "--dryrun", "-l", str(tmp_path / "run")])
    assert code == 0, out
    assert "mixed_precision" in out and "'fp16_mixed'  [cli]" in out, out
