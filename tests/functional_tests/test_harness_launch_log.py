"""One real CPU run through ``scripts/performance/run_script.py`` (torchrun, two gloo ranks, the tiny
recipe), then the same command again: ``launch.log`` holds everything the ranks printed while the
console leaves out the known third-party noise, and the second run, whose checkpoint already holds
every iteration, is answered before any rank starts."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.functional

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "performance" / "run_script.py"
TINY = ["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "2", "-ep", "2", "--max_steps", "2", "-gb", "4"]


def harness(*argv, timeout=600):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *argv], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def test_launch_log_is_complete_and_a_finished_run_is_not_launched_again(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    saving = [f"checkpoint.save={ckpt}", f"checkpoint.load={ckpt}"]
    first = harness(*TINY, "-l", str(tmp_path / "first"), *saving)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    log = (tmp_path / "first" / "launch.log").read_text()
    console = first.stdout
    # megatron-core's INFO records and the import-time warnings: in the log, from every rank, not on the console
    for rank in (0, 1):
        assert f"[default{rank}]:[rank {rank}] INFO megatron.core." in log
    assert "Warning: " in log and "INFO megatron.core." not in console and "Warning: " not in console
    rank_lines = [line for line in console.splitlines() if line.startswith("[default")]
    assert rank_lines and set(rank_lines) <= set(log.splitlines())  # the console is a part of the log
    assert "[quiet]" not in log and "[quiet]" not in console

    again = harness(*TINY, "-l", str(tmp_path / "again"), *saving)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"nothing to train: {ckpt} holds iteration 2 and train.train_iters=2" in again.stdout
    assert "nothing was launched" in again.stdout and "== starting" not in again.stdout
    assert not (tmp_path / "again").exists()
