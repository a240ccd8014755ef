"""The harness on a shared cluster, through its real entry point (``megatron.bridge.perf.harness.run.main``):
it never writes or deletes through a planted link, never uses a directory that is not a run
directory of its own, never lets two runs share one, and names what it refuses before launch.

Refusals come before any launch (``no_launch``); where a run must reach the launch, the launch is
replaced by a stand-in that records what the ranks would find."""

from __future__ import annotations

import hashlib
import io
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import megatron.bridge.perf.harness.execution as execution_module
from megatron.bridge.perf.harness.run import main
from megatron.bridge.perf.harness.run_dir import MARKER, claim
from megatron.bridge.perf.harness.supervisor import JobOutcome

TINY_CPU = ["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "2", "-ep", "2"]
RUN_DIR_NAMES = [
    "config.yaml",
    "launch.log",
    "summary.json",
    "failures",
    "torchrun",
    "profile",
    "launch.sbatch",
    MARKER,
]
"""Every name the harness or a rank writes, replaces or deletes directly under a run directory."""


def run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return main(argv, out=out), out.getvalue()


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file and a directory outside the run that planted links point at."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("precious")
    return outside


def untouched(victim: Path) -> bool:
    return (
        sorted(p.name for p in victim.iterdir()) == ["precious.txt"]
        and (victim / "precious.txt").read_text() == "precious"
    )


@pytest.fixture
def stand_in_launch(monkeypatch):
    """The launch replaced: records the run directory as the ranks would find it, ends like a job
    that trained and wrote nothing else."""
    seen: dict = {}

    def launch(plan, **kwargs):
        seen["plan"] = plan
        seen["config"] = (plan.log_dir / "config.yaml").read_text()
        return JobOutcome(exit_code=0)

    monkeypatch.setattr(execution_module, "run_plan", launch)
    return seen


def own_run_dir(path: Path) -> Path:
    """A run directory an earlier run of the harness left (marked, with its files)."""
    claim(path).release()
    (path / "summary.json").write_text("{}")
    return path


# --------------------------------------------------------------------------------------------- planted links
@pytest.mark.parametrize("name", RUN_DIR_NAMES)
def test_a_link_planted_at_any_name_a_run_writes_is_refused_and_its_target_kept(name, tmp_path, victim, no_launch):
    run_dir = own_run_dir(tmp_path / "run")
    target = victim if name in ("failures", "torchrun", "profile") else victim / "precious.txt"
    (run_dir / name).unlink(missing_ok=True)
    (run_dir / name).symlink_to(target)
    code, out = run([*TINY_CPU, "--max_steps", "2", "-l", str(run_dir)])
    assert code == 2 and "nothing was launched" in out, out
    assert str(run_dir / name) in out and "symbolic link" in out, out
    assert untouched(victim)


def test_a_link_planted_in_a_checkpoint_directory_is_refused_before_launch(tmp_path, victim, no_launch):
    ckpt = tmp_path / "ck"
    ckpt.mkdir()
    (ckpt / "latest_checkpointed_iteration.txt.tmp").symlink_to(victim / "precious.txt")
    code, out = run(
        [
            *TINY_CPU,
            "--max_steps",
            "2",
            "-l",
            str(tmp_path / "run"),
            f"checkpoint.save={ckpt}",
            f"checkpoint.load={ckpt}",
        ]
    )
    assert code == 2 and "checkpoint-save-entries-yours" in out and "checkpoint-load-entries-yours" in out, out
    assert "latest_checkpointed_iteration.txt.tmp: a symbolic link" in out
    assert untouched(victim)


# --------------------------------------------------------------------------------------------- whose directory
@pytest.mark.parametrize("value", ["", "   "], ids=["empty", "blank"])
def test_an_empty_run_directory_value_is_refused(value, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*TINY_CPU, "-l", value], out=io.StringIO())
    assert exc.value.code == 2 and "an unset shell variable?" in capsys.readouterr().err


def test_a_directory_the_harness_did_not_make_is_left_alone(tmp_path, no_launch):
    home = tmp_path / "home"  # what -l ~ or -l . gives: someone's directory with their files
    (home / "failures").mkdir(parents=True)
    for name in ("summary.json", "launch.log", "config.yaml", "failures/keep.txt"):
        (home / name).write_text("mine")
    code, out = run([*TINY_CPU, "--max_steps", "2", "-l", str(home)])
    assert code == 2 and "is not a run directory of this harness" in out, out
    assert all(
        (home / name).read_text() == "mine"
        for name in ("summary.json", "launch.log", "config.yaml", "failures/keep.txt")
    )


def test_an_empty_directory_of_yours_becomes_the_run_directory(tmp_path, stand_in_launch):
    (tmp_path / "empty").mkdir()
    code, out = run([*TINY_CPU, "--max_steps", "2", "-l", str(tmp_path / "empty")])
    assert code == 0, out
    assert (tmp_path / "empty" / MARKER).is_file() and (tmp_path / "empty" / "config.yaml").is_file()


def test_a_rerun_in_its_own_directory_replaces_only_what_it_owns(tmp_path, stand_in_launch):
    run_dir = own_run_dir(tmp_path / "run")
    (run_dir / "notes.txt").write_text("kept")
    code, out = run([*TINY_CPU, "--max_steps", "2", "-l", str(run_dir)])
    assert code == 0, out
    assert not (run_dir / "summary.json").exists() and (run_dir / "notes.txt").read_text() == "kept"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_another_users_entry_in_the_run_directory_is_refused(tmp_path, no_launch):
    run_dir = own_run_dir(tmp_path / "run")
    os.chown(run_dir / "summary.json", 65534, 65534)
    code, out = run([*TINY_CPU, "-l", str(run_dir)])
    assert code == 2 and "summary.json: belongs to" in out, out


@pytest.mark.parametrize(
    "make_path, said",
    [
        (lambda tmp: tmp / ("x" * 300), "a file name holds at most 255"),
        (lambda tmp: tmp / "/".join(["y" * 200] * 21), "file systems take at most 4096"),
        (lambda tmp: Path("/proc/mylogs"), "/proc/mylogs"),
    ],
    ids=["long-name", "long-path", "under-proc"],
)
def test_a_run_directory_that_cannot_be_made_is_refused_without_a_traceback(make_path, said, tmp_path, no_launch):
    code, out = run([*TINY_CPU, "--max_steps", "2", "-l", str(make_path(tmp_path))])
    assert code == 2 and said in out and "Traceback" not in out, out


# --------------------------------------------------------------------------------------------- two runs
def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path, monkeypatch, stand_in_launch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("time.strftime", lambda fmt, *a: "20260101_120000")
    dirs = []
    for lr in ("1e-3", "2e-3"):
        code, out = run([*TINY_CPU, "--max_steps", "2", f"optimizer.lr={lr}"])
        assert code == 0, out
        dirs.append(stand_in_launch["plan"].log_dir)
        assert f"lr: {lr}" in stand_in_launch["config"] or f"lr: {float(lr)}" in stand_in_launch["config"]
    assert dirs[0] != dirs[1] and all(d.parent == tmp_path / "runs" for d in dirs)


def test_a_run_directory_another_harness_is_using_is_refused(tmp_path, no_launch):
    held = claim(tmp_path / "run")
    try:
        code, out = run([*TINY_CPU, "--max_steps", "2", "-l", str(tmp_path / "run")])
    finally:
        held.release()
    assert code == 2 and "in use by another harness" in out and f"pid {os.getpid()}" in out, out


def test_a_run_directory_removed_during_the_run_is_said(tmp_path, monkeypatch):
    def launch(plan, **kwargs):
        shutil.rmtree(plan.log_dir)  # someone cleans up while the job runs
        return JobOutcome(exit_code=0)

    monkeypatch.setattr(execution_module, "run_plan", launch)
    code, out = run([*TINY_CPU, "--max_steps", "2", "-l", str(tmp_path / "run")])
    assert "was removed or replaced during the run" in out, out


# --------------------------------------------------------------------------------------------- launch values
def test_the_printed_submit_command_is_quoted(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    run_dir = tmp_path / "r $(touch pwned)"
    code, out = run(
        ["-mr", "qwen3_30b_a3b", "-g", "h100", "-ng", "16", "-gn", "8", "--max_steps", "8", "-l", str(run_dir)]
    )
    assert code == 0, out
    line = next(line for line in out.splitlines() if "submit it with:" in line)
    assert shlex.split(line.split("submit it with: ")[1]) == ["sbatch", str(run_dir / "launch.sbatch")]
    assert stat.S_IMODE((run_dir / "launch.sbatch").stat().st_mode) & 0o100


def test_slurm_job_id_without_srun_is_refused_before_anything_is_written(tmp_path, monkeypatch, no_launch):
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun here
    code, out = run(["-mr", "qwen3_moe_tiny", "-g", "h100", "-ng", "2", "-ep", "2", "-l", str(tmp_path / "run")])
    assert code == 3 and "no srun on PATH" in out and not (tmp_path / "run").exists(), out


# --------------------------------------------------------------------------------------------- what the ranks read
def test_the_ranks_are_given_the_digest_of_the_config_their_harness_wrote(tmp_path, stand_in_launch):
    code, out = run([*TINY_CPU, "--max_steps", "2", "-l", str(tmp_path / "run")])
    assert code == 0, out
    argv = stand_in_launch["plan"].argv
    written = hashlib.sha256((tmp_path / "run" / "config.yaml").read_bytes()).hexdigest()
    assert argv[argv.index("--config-sha256") + 1] == written


def test_a_rank_refuses_a_config_file_that_is_not_the_one_its_harness_wrote(tmp_path, stand_in_launch):
    code, out = run([*TINY_CPU, "--max_steps", "2", "-l", str(tmp_path / "run")])
    config = tmp_path / "run" / "config.yaml"
    config.write_text(config.read_text().replace("train_iters: 2", "train_iters: 2000"))  # replaced after launch
    argv = stand_in_launch["plan"].argv
    worker = argv[argv.index("-m", 3) :]  # the rank's command after torchrun's flags
    proc = subprocess.run(
        [sys.executable, *worker],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, RANK="0", CUDA_VISIBLE_DEVICES=""),
    )
    assert proc.returncode == 1 and "config-file-is-the-one-written" in proc.stderr, proc.stderr
