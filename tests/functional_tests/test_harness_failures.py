"""Failures of a real CPU job through the harness, and what the report says about them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.functional

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "performance" / "run_script.py"
TINY = ["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "2", "-ep", "2", "-gb", "4"]


def harness(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *argv], cwd=REPO, capture_output=True, text=True, timeout=900)


def test_the_nan_stop_names_the_step_in_which_the_gradients_went_bad(tmp_path):
    proc = harness(*TINY, "--max_steps", "6", "-l", str(tmp_path / "run"), "optimizer.lr=1e6", "optimizer.min_lr=1e5")
    assert proc.returncode != 0
    trained = proc.stdout.count("| loss ")  # iteration lines of the steps that finished
    assert f"iteration {trained + 1}: Unexpected result nan" in proc.stdout, proc.stdout[-3000:]
    assert "iteration 0:" not in proc.stdout
