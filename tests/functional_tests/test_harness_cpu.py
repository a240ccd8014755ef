"""The harness through its real launcher (torchrun, gloo) in the CPU smoke mode.

Each test starts ``scripts/performance/run_script.py`` as a user would; the runs are a few
iterations of the tiny Qwen3-MoE recipe (two processes, EP=2, so dispatch/combine really crosses
ranks).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.functional

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "performance" / "run_script.py"
TINY = ["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "2", "-ep", "2", "--max_steps", "3", "-gb", "4"]


def harness(*argv, timeout=600):
    return subprocess.run([sys.executable, str(SCRIPT), *argv], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_cpu_sweep_trains_each_value_and_writes_summary_markdown_and_plot(tmp_path):
    """``-g cpu -ng 2 -mr qwen3_moe_tiny`` trains (once per swept value), writes ``summary.json``,
    prints the results table, then writes ``sweep.md`` and ``sweep.png``. One test, two trainings:
    the launcher dominates the cost on a 2-core CI machine."""
    root = tmp_path / "sweep"
    proc = harness(*TINY, "-l", str(root), "--steady_state_window", "2,3",
                   "--sweep", "comm_overlap.overlap_moe_expert_parallel_comm=false,true")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    losses = []
    for sub in ("00_overlap_moe_expert_parallel_comm=false", "01_overlap_moe_expert_parallel_comm=true"):
        summary = json.loads((root / sub / "summary.json").read_text())
        losses.append(summary["losses"])
        assert summary["world_size"] == 2 and len(summary["losses"]) == 3
        assert all(loss == loss and loss < 20 for loss in summary["losses"])  # finite
        assert (root / sub / "config.yaml").is_file()
        assert str(root / sub / "summary.json") in proc.stdout
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)  # the overlap schedule changes timing, not maths
    assert proc.stdout.count("Results") == 2 and "iterations 2-3" in proc.stdout
    md = (root / "sweep.md").read_text()
    assert "| `false` |" in md and "| `true` |" in md and "1.000x" in md
    assert (root / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_failing_rank_ends_job_with_its_error(tmp_path):
    log_dir = tmp_path / "bad"
    proc = harness(*TINY, "-l", str(log_dir), "dataset.data_paths=[/nonexistent/prefix]", timeout=300)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "job failed with exit code" in out and "--- rank" in out and "nonexistent" in out
