"""The README's CPU quick start, as written there, on a machine where Transformer Engine imports.

The command is read from the README (step 1 of the quick start) and run with this interpreter; a
``sitecustomize`` makes every process of the run see Transformer Engine as installed, as in NVIDIA's
containers, where ``layer_spec=auto`` once chose TE's layers for a CPU run and failed.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.functional

REPO = Path(__file__).resolve().parents[2]
FAKE_TE_SITE = Path(__file__).with_name("fake_te_site")


def readme_cpu_command() -> list[str]:
    """Step 1 of the README's quick start: the harness command with ``-g cpu``."""
    for line in (REPO / "README.md").read_text().splitlines():
        if line.startswith("uv run python scripts/performance/run_script.py") and "-g cpu" in line:
            return shlex.split(line)[3:]  # after "uv run python"
    raise AssertionError("the README has no CPU quick-start command")


def test_cpu_quick_start_trains_torch_native_layers_where_te_imports(tmp_path):
    argv = [sys.executable, *readme_cpu_command(), "-l", str(tmp_path / "run")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(FAKE_TE_SITE), str(REPO / "src")]), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "layer spec: torch_native (auto: a CPU run; Transformer Engine's layers need CUDA)" in proc.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["overlap_report"]["transformer_engine"] == "2.20.2"  # the ranks saw TE as installed
    assert summary["layer_spec"] == "torch_native" and len(summary["losses"]) == 10
