"""``pretrain()`` lets go of its model when it returns, so runs can follow each other in one process."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).parent / "pretrain_twice.py"


@pytest.mark.parametrize("world", ["real", "emulated"])
def test_a_finished_run_frees_its_model_for_the_next(tmp_path, world):
    """Checked the moment pretrain returns, with no garbage collection of the caller's. Before the
    fix every parameter of the first run stayed alive: held through DDP's gradient hooks by the
    routing probabilities the dispatchers keep with their autograd graph, and, until the next
    garbage collection, by the cycles through the model config's schedule hooks. In a data-parallel
    world with the parameter all-gather overlapped, DDP's forward pre-hooks held it too (every
    emulated benchmark case kept its model, and a job of 20 cases ran out of the GPU's memory)."""
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(tmp_path), world], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads(
        next(line for line in proc.stdout.splitlines() if line.startswith("REPORT ")).removeprefix("REPORT ")
    )
    for run in ("first", "second"):
        assert report[run]["losses"] == 2
        assert report[run]["watched"] > 0 and report[run]["alive"] == 0, report
