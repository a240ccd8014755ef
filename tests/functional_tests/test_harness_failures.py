"""Failures of a real CPU job through the harness, and what the report says about them."""

from __future__ import annotations

import json
import math
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


@pytest.mark.parametrize("lr, save_interval, stop, what", [
    # gradients turn NaN in step 3, so the loss of iteration 4 is the first NaN; iteration 2 was saved
    pytest.param("7e3", 2, 4, "loss", id="nan-loss"),
    # gradients turn NaN in step 2 (the loss of that step, computed before the update, is finite):
    # the save of iteration 2 would publish NaN parameters
    pytest.param("1e6", 1, 2, "parameters", id="nan-parameters-at-a-save"),
])
def test_a_nonfinite_loss_or_state_stops_the_run_and_is_never_saved(tmp_path, lr, save_interval, stop, what):
    ckpt, run = tmp_path / "ckpt", tmp_path / "run"
    ckpt.mkdir()
    proc = harness(*TINY, "--max_steps", "6", "-l", str(run), f"optimizer.lr={lr}", "ddp.check_for_nan_in_grad=false",
                   f"checkpoint.save={ckpt}", f"checkpoint.load={ckpt}", f"checkpoint.save_interval={save_interval}")
    assert proc.returncode == 1, proc.stdout[-3000:]
    first = proc.stdout[proc.stdout.index("job failed"):].splitlines()[0]  # the report leads with the cause
    assert f"NonFinite{what.capitalize()}Error: non-finite {what} at iteration {stop} " in first, first

    saved = list(range(save_interval, stop, save_interval))  # nothing of iteration `stop`, no leftovers
    assert sorted(p.name for p in ckpt.glob("iter_*")) == [f"iter_{i:07d}" for i in saved]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(saved[-1])

    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped_on_nonfinite"]["iteration"] == stop and summary["stopped_on_nonfinite"]["what"] == what
    assert (summary["final_iteration"] == stop
            and summary["stop_reason"].startswith(f"non-finite {what} at iteration {stop}"))
    losses = summary["losses"]
    assert len(losses) == stop and all(map(math.isfinite, losses[:-1]))
    assert math.isfinite(losses[-1]) == (what != "loss")
    final = summary["final_loss"]  # the last loss logged, never an earlier finite one
    assert math.isnan(final) if what == "loss" else final == losses[-1]
