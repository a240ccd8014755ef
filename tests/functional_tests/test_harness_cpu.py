"""The harness through its real launcher (torchrun, gloo) in the CPU smoke mode.

Each test starts ``scripts/performance/run_script.py`` as a user would; the runs are a few
iterations of the tiny Qwen3-MoE recipe (two processes, EP=2, so dispatch/combine really crosses
ranks).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness_process import HarnessProcess, descendants, rank_pid, running

from megatron.bridge.models.dispatch.megatron_alltoall import GATHER_LINE

pytestmark = pytest.mark.functional

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "performance" / "run_script.py"
TINY = ["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "2", "-ep", "2", "--max_steps", "3", "-gb", "4"]
TINY_SLOW = ["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "2", "-ep", "2", "-gb", "4", "--max_steps", "200"]
"""Long enough that a signal or a kill always lands mid-run."""
FAKE_SLURM = Path(__file__).with_name("fake_slurm")


def harness(*argv, timeout=600):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *argv], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def test_cpu_sweep_trains_each_value_and_writes_summary_markdown_and_plot(tmp_path):
    """``-g cpu -ng 2 -mr qwen3_moe_tiny`` trains (once per swept value), writes ``summary.json``,
    prints the results table, then writes ``sweep.md`` and ``sweep.png``. One test, two trainings:
    the launcher dominates the cost on a 2-core CI machine. The torch-native kernel settings given
    as overrides reach the start-up lines and ``summary.json``, and so does the chunk sort by one row
    gather of megatron-core's alltoall dispatcher, which the torch-native layers keep at EP=2 (its
    parity with megatron-core's sort: ``test_chunk_sort.py``)."""
    root = tmp_path / "sweep"
    kernels = dict(compile=True, grouped_gemm_backend="loop", cross_entropy_backend="torch", wgrad_accumulation="auto")
    proc = harness(
        *TINY,
        "-l",
        str(root),
        "--steady_state_window",
        "2,3",
        "model.torch_native_grouped_gemm_backend=loop",
        "model.torch_native_cross_entropy_backend=torch",
        "model.moe_chunk_sort=gather",
        "--sweep",
        "comm_overlap.overlap_moe_expert_parallel_comm=false,true",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    losses = []
    for sub in ("00_overlap_moe_expert_parallel_comm=false", "01_overlap_moe_expert_parallel_comm=true"):
        summary = json.loads((root / sub / "summary.json").read_text())
        losses.append(summary["losses"])
        assert summary["world_size"] == 2 and len(summary["losses"]) == 3
        assert summary["torch_native_kernels"] == kernels
        assert summary["expert_wgrad_accumulation"]["path"] == "unfused"  # no CUDA main_grad on CPU
        assert summary["moe_dispatch_changes"] == [GATHER_LINE]
        assert all(loss == loss and loss < 20 for loss in summary["losses"])  # finite
        assert (root / sub / "config.yaml").is_file()
        assert str(root / sub / "summary.json") in proc.stdout
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)  # the overlap schedule changes timing, not maths
    assert proc.stdout.count("Results") == 2 and "iterations 2-3" in proc.stdout
    assert proc.stdout.count("torch-native kernels: torch.compile on, grouped GEMM loop, cross-entropy torch") == 2
    assert proc.stdout.count("loss: torch_native fused cross-entropy (torch kernels)") == 2
    assert proc.stdout.count(GATHER_LINE) == 2
    md = (root / "sweep.md").read_text()
    # CPU timings rank nothing
    assert "| `false` |" in md and "| `true` |" in md and "n/a (CPU)" in md and "x |" not in md
    assert (root / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_a_micro_batch_over_the_sorted_dispatchers_budget_stops_the_run_before_its_update(tmp_path):
    """``model.torch_native_rank_capacity_factor=1.0`` (a balanced rank's rows) on the tiny model's
    uneven routing: the first step goes over it, and every rank stops after the backward, before the
    optimizer step, saying the factor that step needed; ``summary.json`` records it, nothing is saved."""
    ckpt = tmp_path / "ckpt"
    proc = harness(
        *TINY,
        "-l",
        str(tmp_path / "run"),
        "model.torch_native_dispatcher=sorted",
        "model.torch_native_rank_capacity_factor=1.0",
        f"checkpoint.save={ckpt}",
        "checkpoint.save_interval=1",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "failed first (exit code 1: ExpertRowsOverflow: iteration 1: a micro-batch routed" in out, out[-3000:]
    assert "the step was not applied" in out and "model.torch_native_rank_capacity_factor to at least 1." in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["final_iteration"] == 0 and "ExpertRowsOverflow" not in summary["stop_reason"]
    assert summary["stop_reason"].startswith("iteration 1: a micro-batch routed")
    assert not list(ckpt.glob("iter_*"))


def _stop_run(tmp_path, signum: int) -> tuple[HarnessProcess, int, Path, float]:
    """A run saving every iteration into an empty directory it also resumes from, stopped by
    ``signum`` to the harness once iteration 2 is printed."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    run = HarnessProcess(
        *TINY_SLOW,
        "-l",
        str(tmp_path / "run"),
        f"checkpoint.save={ckpt}",
        f"checkpoint.load={ckpt}",
        "checkpoint.save_interval=1",
    )
    run.wait_for("iteration      2/")
    sent = time.monotonic()
    run.send(signum)
    code = run.finish()
    return run, code, ckpt, time.monotonic() - sent


@pytest.fixture(scope="module")
def sigterm_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("sigterm")
    run, code, ckpt, stop_s = _stop_run(tmp_path, signal.SIGTERM)
    return dict(run=run, code=code, ckpt=ckpt, stop_s=stop_s, left=run.left_behind(), tmp=tmp_path)


def _check_clean_stop(
    run: HarnessProcess, code: int, ckpt: Path, left: list[int], signum: int, fresh: bool = True
) -> int:
    """A clean stop, reported under the signal the harness received (by the harness, by the ranks,
    which got SIGTERM, and in ``summary.json``)."""
    out, name = run.output, signal.Signals(signum).name
    assert code == 128 + signum, out[-3000:]
    assert not left, f"processes left behind: {left}"
    assert f"{name} received" in out
    if fresh:  # an empty directory: a fresh start, and the run says so
        assert f"no checkpoint in {ckpt} yet: starting from iteration 0" in out
    stopped = [line for line in out.splitlines() if line.startswith("stopped by ")]
    assert len(stopped) == 1, out[-3000:]
    iteration = int(stopped[0].split("iteration ")[1].split(";")[0])
    assert stopped[0] == f"stopped by {name} at iteration {iteration}; checkpoint at {ckpt / f'iter_{iteration:07d}'}"
    assert f"[megatron.bridge] {name}: stopping at iteration {iteration}" in out
    assert out.count(f"saved checkpoint at iteration {iteration} ") == 1  # a save-interval iteration, saved once
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == str(iteration)
    summary = json.loads((run.log_dir / "summary.json").read_text())
    assert (summary["stop_reason"], summary["stopped_by_signal"]) == (name, True)
    assert "Traceback" not in out and "job failed" not in out and "SignalException" not in out
    return iteration


def test_sigterm_to_the_harness_stops_the_job_after_the_step_with_one_save(sigterm_run):
    """SIGTERM to the harness process: every rank finishes its step, saves once, exits; the harness
    says where it stopped and exits 143 with nothing left running."""
    r = sigterm_run
    _check_clean_stop(r["run"], r["code"], r["ckpt"], r["left"], signal.SIGTERM)
    assert r["stop_s"] < 60


def test_resume_then_ctrl_c_under_uv_continues_labels_the_timed_iterations_and_stops_the_same_way(sigterm_run):
    """The same directory again, started with ``uv run`` as users do: the run resumes where the
    SIGTERM stop saved; Ctrl-C (SIGINT to uv and the harness at once, as from a terminal; uv also
    passes its copy on) stops it like SIGTERM did, not as a second, killing signal; the steady-state
    window (steps 2-3 of this run) is labelled with the iteration numbers that were timed."""
    ckpt = sigterm_run["ckpt"]
    start = int((ckpt / "latest_checkpointed_iteration.txt").read_text())
    run = HarnessProcess(
        *TINY_SLOW,
        "--steady_state_window",
        "2,3",
        "-l",
        str(sigterm_run["tmp"] / "resumed"),
        f"checkpoint.save={ckpt}",
        f"checkpoint.load={ckpt}",
        "checkpoint.save_interval=1",
        via_uv=True,
    )
    run.wait_for(f"iteration {start + 4:>6d}/")
    run.press_ctrl_c()
    code = run.finish()
    out = run.output
    iteration = _check_clean_stop(run, code, ckpt, run.left_behind(), signal.SIGINT, fresh=False)
    assert iteration >= start + 4
    assert f"resumes from iteration {start} in {ckpt}" in out and f"resumed from iteration {start}" in out
    assert f"iterations {start + 2}-{start + 3} (steps 2-3 of this run)" in out


def test_killed_rank_is_reported_first(tmp_path):
    """``kill -9`` of rank 1: the report leads with rank 1 and its exit code, not with rank 0's
    "Connection reset by peer" that followed it."""
    run = HarnessProcess(*TINY_SLOW, "-l", str(tmp_path / "run"))
    run.wait_for("iteration      2/")
    victim = rank_pid(run.proc.pid, 1)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    code = run.finish()
    out = run.output
    assert code != 0
    assert "rank 1 failed first (exit code -9 (killed by SIGKILL))" in out, out[-3000:]
    assert "rank 0: then" in out
    assert out.index("rank 1 failed first") < out.index("rank 0: then")
    assert not run.left_behind()


def test_srun_mode_forwards_the_stop_to_srun(tmp_path):
    """Inside an allocation the harness runs srun; SIGTERM to the harness goes to srun (which
    forwards it to every task). A stand-in srun records it."""
    log = tmp_path / "srun.log"
    env = dict(
        os.environ, SLURM_JOB_ID="4242", FAKE_SRUN_LOG=str(log), PATH=f"{FAKE_SLURM}{os.pathsep}{os.environ['PATH']}"
    )
    run = HarnessProcess(
        "-mr", "qwen3_moe_tiny", "-g", "h100", "-ng", "2", "-ep", "2", "-l", str(tmp_path / "run"), env=env
    )
    deadline = time.monotonic() + 120
    while not (log.is_file() and "started" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    run.send(signal.SIGTERM)
    code = run.finish()
    assert code == 143, run.output[-3000:]
    assert log.read_text().split() == ["started", "TERM"]
    assert "stopped by SIGTERM before training started; no checkpoint written" in run.output
    assert not run.left_behind()


def test_batch_script_forwards_slurms_pre_timeout_signal_to_srun(tmp_path):
    """The generated sbatch script asks SLURM for SIGTERM before the time limit and forwards it to
    srun; run here by bash with stand-ins for srun and scontrol."""
    from megatron.bridge.perf.harness.launcher import SLURM_STOP_LEAD_S, plan_launch

    plan = plan_launch(
        cpu=False,
        num_gpus=16,
        gpus_per_node=8,
        procs_per_gpu=1,
        config_path=tmp_path / "c.yaml",
        log_dir=tmp_path,
        environ={},
        workdir=tmp_path,
    )
    script = tmp_path / "launch.sbatch"
    script.write_text(plan.script_text)
    assert f"#SBATCH --signal=B:TERM@{SLURM_STOP_LEAD_S}" in plan.script_text
    log = tmp_path / "srun.log"
    env = dict(
        os.environ,
        FAKE_SRUN_LOG=str(log),
        SLURM_JOB_NODELIST="node1",
        PATH=f"{FAKE_SLURM}{os.pathsep}{os.environ['PATH']}",
    )
    batch = subprocess.Popen(
        ["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 30
    while not (log.is_file() and "started" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    shell_children = descendants(batch.pid)
    batch.send_signal(signal.SIGTERM)  # what SLURM sends the batch shell SLURM_STOP_LEAD_S before the limit
    out, _ = batch.communicate(timeout=30)
    assert batch.returncode == 0, out  # srun's own exit status: the tasks saved and exited normally
    assert log.read_text().split() == ["started", "TERM"]
    assert "forwarding SIGTERM to srun" in out
    assert not [pid for pid in shell_children if running(pid)]
