"""Launch-command construction (1 GPU, 8 GPUs, 16 GPUs on 2 nodes, SLURM allocation, CPU) and
failure propagation."""

import sys
from pathlib import Path

import pytest

from megatron.bridge.perf.harness.failure_report import failure_report
from megatron.bridge.perf.harness.launcher import (
    ENTRY_MODULE,
    choose_mode,
    plan_launch,
    run_plan,
)

PY = "/venv/bin/python"
CHILDREN = Path(__file__).with_name("children")


def plan(tmp_path, *, cpu=False, ng=1, gn=8, ppg=1, environ=None, **kw):
    return plan_launch(
        cpu=cpu,
        num_gpus=ng,
        gpus_per_node=gn,
        procs_per_gpu=ppg,
        config_path=tmp_path / "config.yaml",
        log_dir=tmp_path,
        environ=environ or {},
        python=PY,
        workdir=Path("/repo"),
        **kw,
    )


def _entry_tail(argv, cfg):
    i = argv.index(ENTRY_MODULE)
    assert argv[i - 1] == "-m" and argv[i + 1 :] == ["--config-file", str(cfg)]


@pytest.mark.parametrize("ng", [1, 8])
def test_single_node_uses_torchrun_one_process_per_gpu(tmp_path, ng):
    p = plan(tmp_path, ng=ng, cuda_device_max_connections=32)
    assert p.mode == "torchrun" and p.nprocs == ng and p.nodes == 1
    assert p.argv[:3] == [PY, "-m", "megatron.bridge.perf.loopback_torchrun"]
    assert f"--nproc-per-node={ng}" in p.argv and "--max-restarts=0" in p.argv and "--rdzv-backend=loopback" in p.argv
    assert "--rdzv-endpoint=127.0.0.1:0" in p.argv and "--standalone" not in p.argv  # served on loopback only
    _entry_tail(p.argv, tmp_path / "config.yaml")
    assert p.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    assert "CUDA_DEVICE_MAX_CONNECTIONS=32" in p.shell()


def test_two_ranks_share_one_gpu(tmp_path):
    p = plan(tmp_path, ng=1, ppg=2)
    assert p.mode == "torchrun" and p.nprocs == 2 and "--nproc-per-node=2" in p.argv


def test_sixteen_gpus_on_two_nodes_writes_sbatch(tmp_path):
    p = plan(
        tmp_path, ng=16, gn=8, account="acct", partition="batch", time_limit="00:20:00", cuda_device_max_connections=32
    )
    assert p.mode == "sbatch" and p.nodes == 2 and p.nprocs == 16
    assert p.argv == ["sbatch", str(tmp_path / "launch.sbatch")]
    s = p.script_text
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --account=acct",
        "#SBATCH --partition=batch",
        "#SBATCH --time=00:20:00",
        "export CUDA_DEVICE_MAX_CONNECTIONS=32",
        "MASTER_ADDR",
        "cd /repo",
    ):
        assert line in s, line
    srun = next(line for line in s.splitlines() if line.startswith("srun"))
    assert "--kill-on-bad-exit=1" in srun and f"{PY} -m {ENTRY_MODULE} --config-file" in srun


def test_sbatch_without_account_notes_defaults(tmp_path):
    p = plan(tmp_path, ng=16, gn=8)
    assert "#SBATCH --account" not in p.script_text and p.notes


def test_inside_slurm_allocation_uses_srun(tmp_path):
    p = plan(tmp_path, ng=16, gn=8, environ={"SLURM_JOB_ID": "42"})
    assert p.mode == "srun"
    assert p.argv[:1] == ["srun"]
    assert {"--nodes=2", "--ntasks=16", "--ntasks-per-node=8", "--kill-on-bad-exit=1"} <= set(p.argv)
    _entry_tail(p.argv, tmp_path / "config.yaml")


def test_cpu_mode_runs_local_gloo_processes(tmp_path):
    p = plan(tmp_path, cpu=True, ng=2, gn=8, environ={"SLURM_JOB_ID": "42"}, cuda_device_max_connections=32)
    assert p.mode == "cpu" and p.nprocs == 2 and p.nodes == 1
    assert "--nproc-per-node=2" in p.argv
    assert p.env["CUDA_VISIBLE_DEVICES"] == "" and "CUDA_DEVICE_MAX_CONNECTIONS" not in p.env


@pytest.mark.parametrize(
    "cpu, ng, gn, env, mode",
    [
        (True, 4, 1, {}, "cpu"),
        (False, 8, 8, {"SLURM_JOB_ID": "1"}, "srun"),
        (False, 9, 8, {}, "sbatch"),
        (False, 8, 8, {}, "torchrun"),
    ],
)
def test_choose_mode(cpu, ng, gn, env, mode):
    assert choose_mode(cpu=cpu, num_gpus=ng, gpus_per_node=gn, environ=env) == mode


def test_failing_job_returns_its_code_and_tails_the_failing_rank(tmp_path, capsys):
    rank_dir = tmp_path / "torchrun" / "none_abc" / "attempt_0" / "1"
    rank_dir.mkdir(parents=True)
    (rank_dir / "stderr.log").write_text("ok line\nTraceback (most recent call last):\nValueError: boom on rank 1\n")
    (tmp_path / "torchrun" / "none_abc" / "attempt_0" / "0").mkdir()
    (tmp_path / "torchrun" / "none_abc" / "attempt_0" / "0" / "stderr.log").write_text("fine\n")
    (tmp_path / "failures").mkdir()
    (tmp_path / "failures" / "rank_00001.json").write_text(
        '{"rank": 1, "time": 1.0, "error": "ValueError: boom on rank 1"}'
    )
    p = plan(tmp_path, cpu=True, ng=2)
    p.argv = [sys.executable, str(CHILDREN / "exit_with.py"), "7"]
    outcome = run_plan(p, stream=sys.stdout)
    assert outcome.exit_code == 7 and not outcome.stopped
    report = failure_report(tmp_path, outcome.exit_code, outcome.launcher_lines)
    assert "exit code 7" in report and "rank 1 failed first" in report and "boom on rank 1" in report
    assert "fine" not in report


def test_failure_report_without_logs(tmp_path):
    assert failure_report(tmp_path, 3) == "job failed with exit code 3; no rank reported a failure"


def test_successful_plan_returns_zero(tmp_path):
    p = plan(tmp_path, cpu=True, ng=1)
    p.argv = [sys.executable, str(CHILDREN / "exit_with.py"), "0"]
    assert run_plan(p).exit_code == 0


def test_sbatch_plan_is_not_run(tmp_path):
    with pytest.raises(ValueError):
        run_plan(plan(tmp_path, ng=16, gn=8))
