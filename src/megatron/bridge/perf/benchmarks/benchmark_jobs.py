"""What the GPU benchmarks of ``scripts/performance/`` share: cases built as the harness builds them,
trained one after another in one ``torchrun`` job, a job time limit that keeps what finished, and the
facts a result records (commit, the measured matmul ceiling beside the nominal peak).

The host is a fact too (:func:`host_facts`): an eager EP > 1 step is bound by the host, so two
machines with the same GPU give different steps, and a result names the CPU it ran on.

A case is a ``run_script.py`` command line; :func:`write_configs` resolves and validates each one
through the harness (so a benchmark measures configurations the product builds, and a refused one
stops the benchmark before anything runs) and writes the YAML the ranks load.
"""

from __future__ import annotations

import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from megatron.bridge.perf.harness.argument_parser import parse_args
from megatron.bridge.perf.harness.config_builder import build_config
from megatron.bridge.perf.harness.execution import prepare
from megatron.bridge.perf.harness.job import make_job
from megatron.bridge.perf.harness.launcher import ENTRY_MODULE, torchrun_argv

NOMINAL_PEAK_TFLOPS = 989.5
"""Dense bf16 peak of an H100/H200 SXM (datasheet): what MFU is quoted against."""
JOB_TIMED_OUT = 124
"""Exit status of a job stopped at its time limit (as ``timeout(1)`` reports it)."""
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
"""NVLink multicast stays off on shared hosts, in the launched workers too."""


def write_configs(harness_argvs: Iterable[Sequence[str]]) -> tuple[list[Path], dict[str, str]]:
    """Resolve, validate and write each case's config (``-l`` in each argv names its directory);
    the YAML paths and the environment every case of the job needs (e.g. the
    ``CUDA_DEVICE_MAX_CONNECTIONS`` EP overlap asks for). The cases share one process, so the
    environment is the union: with a whole-iteration graph case among them, every case of the job
    runs with the expandable segments that case launches with."""
    paths, env = [], {}
    for argv in harness_argvs:
        parsed = parse_args(list(argv))
        job = make_job(build_config(parsed), parsed)
        prepare(job)
        paths.append(job.built.log_dir / "config.yaml")
        env.update(job.plan.env)
    return paths, env


def job_argv(nprocs: int, log_dir: Path, config_paths: Sequence[Path]) -> list[str]:
    """One ``torchrun`` job whose ranks train ``config_paths`` in order (one start-up for all)."""
    worker = [sys.executable, "-m", ENTRY_MODULE] + [x for p in config_paths for x in ("--config-file", str(p))]
    return torchrun_argv(nprocs, log_dir, worker, sys.executable)


def run_logged(argv: list[str], env: dict, log: Path, timeout: float) -> int:
    """Run ``argv`` with its output in ``log``; its exit status, or :data:`JOB_TIMED_OUT`.

    On timeout the whole process group (launcher and workers) is stopped, SIGTERM first, and the
    caller goes on: every case that finished has its ``summary.json``, and losing them (and the
    other jobs) to one slow job would throw away GPU time already spent.
    """
    with open(log, "w") as fh:
        proc = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            return JOB_TIMED_OUT


def stop_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM to the launcher's process group, then SIGKILL to whatever of it is left."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # workers that outlived the launcher share its group
    except ProcessLookupError:
        pass
    proc.wait()


def matmul_ceiling_tflops() -> float | None:
    """bf16 8192^3 matmul rate on GPU 0 (median of 20), the measured ceiling beside the nominal peak."""
    try:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            a @ b
        times = []
        for _ in range(20):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            a @ b
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        del a, b
        torch.cuda.empty_cache()  # the benchmark's jobs, not this process, need the memory
        return 2 * 8192**3 / statistics.median(times) / 1e12
    except Exception as exc:  # a missing GPU only loses this column
        print(f"matmul ceiling not measured: {exc}", flush=True)
        return None


def portable_command(words: Sequence[str], defaults: Mapping[str, str]) -> str:
    """``words`` as one shell command, the value after each flag of ``defaults`` written as that default:
    a committed result names the repository's folders, not this machine's."""
    words = list(words)
    for flag, default in defaults.items():
        if flag in words:
            words[words.index(flag) + 1] = default
    return shlex.join(words)


def git_commit(repo: Path) -> str:
    """``HEAD`` of ``repo`` (``+dirty`` with uncommitted changes to tracked files), or ``unknown``."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo, capture_output=True, text=True
        ).stdout.strip()
        return (sha + ("+dirty" if dirty else "")) or "unknown"
    except OSError:
        return "unknown"


def host_facts(cpuinfo: Path = Path("/proc/cpuinfo"), probe_calls: int = 2000) -> dict[str, Any]:
    """The host a benchmark ran on: its CPU model, logical CPUs, and the host time of one small eager
    torch call (microseconds, median of 5 rounds of ``probe_calls``), the unit a host-bound step is
    made of."""
    return {
        "cpu": cpu_model(cpuinfo),
        "logical_cpus": os.cpu_count(),
        "torch_op_us": round(torch_op_us(probe_calls), 3),
    }


def cpu_model(cpuinfo: Path) -> str:
    """The first ``model name`` of ``cpuinfo`` (Linux), else what ``platform`` says, else ``unknown``."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def torch_op_us(calls: int) -> float:
    """Host microseconds per call of an in-place add on a one-element CPU tensor (median of 5 rounds)."""
    x = torch.zeros(1)
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            x.add_(1)
        rounds.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(rounds)


def device_name() -> str:
    """``N x <GPU name>`` or ``no GPU``."""
    if not torch.cuda.is_available():
        return "no GPU"
    return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
