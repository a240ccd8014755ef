"""Failures of a real CPU job through the harness, and what the report says about them."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.functional

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "performance" / "run_script.py"
TINY = ["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "2", "-ep", "2", "-gb", "4"]


def harness(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *argv], cwd=REPO, capture_output=True, text=True, timeout=900, env=env
    )


def test_the_nan_stop_names_the_step_in_which_the_gradients_went_bad(tmp_path):
    proc = harness(*TINY, "--max_steps", "6", "-l", str(tmp_path / "run"), "optimizer.lr=1e6", "optimizer.min_lr=1e5")
    assert proc.returncode != 0
    trained = proc.stdout.count("| loss ")  # iteration lines of the steps that finished
    assert f"iteration {trained + 1}: Unexpected result nan" in proc.stdout, proc.stdout[-3000:]
    assert "iteration 0:" not in proc.stdout


NONFINITE_SITE = Path(__file__).with_name("nonfinite_site")


@pytest.mark.parametrize(
    "save_interval, stop, what",
    [
        # the loss of iteration 4 is NaN; iteration 2 was saved
        pytest.param(2, 4, "loss", id="nan-loss"),
        # iteration 2's update leaves a NaN parameter (that step's loss, computed before the update, is
        # finite): the save of iteration 2 would publish it
        pytest.param(1, 2, "parameters", id="nan-parameters-at-a-save"),
    ],
)
def test_a_nonfinite_loss_or_state_stops_the_run_and_is_never_saved(tmp_path, save_interval, stop, what):
    """The non-finite value is put there at a chosen iteration (``nonfinite_site``), not waited for."""
    ckpt, run = tmp_path / "ckpt", tmp_path / "run"
    ckpt.mkdir()
    env = dict(
        os.environ,
        BRIDGE_TEST_NONFINITE=f"{what}:{stop}",
        PYTHONPATH=os.pathsep.join(filter(None, [str(NONFINITE_SITE), os.environ.get("PYTHONPATH")])),
    )
    proc = harness(
        *TINY,
        "--max_steps",
        "6",
        "-l",
        str(run),
        "ddp.check_for_nan_in_grad=false",
        f"checkpoint.save={ckpt}",
        f"checkpoint.load={ckpt}",
        f"checkpoint.save_interval={save_interval}",
        env=env,
    )
    assert proc.returncode == 1, proc.stdout[-3000:]
    first = proc.stdout[proc.stdout.index("job failed") :].splitlines()[0]  # the report leads with the cause
    assert f"NonFinite{what.capitalize()}Error: non-finite {what} at iteration {stop} " in first, first

    saved = list(range(save_interval, stop, save_interval))  # nothing of iteration `stop`, no leftovers
    assert sorted(p.name for p in ckpt.glob("iter_*")) == [f"iter_{i:07d}" for i in saved]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(saved[-1])

    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped_on_nonfinite"]["iteration"] == stop and summary["stopped_on_nonfinite"]["what"] == what
    assert summary["final_iteration"] == stop and summary["stop_reason"].startswith(
        f"non-finite {what} at iteration {stop}"
    )
    losses = summary["losses"]
    assert len(losses) == stop and all(map(math.isfinite, losses[:-1]))
    assert math.isfinite(losses[-1]) == (what != "loss")
    final = summary["final_loss"]  # the last loss logged, never an earlier finite one
    assert math.isnan(final) if what == "loss" else final == losses[-1]
