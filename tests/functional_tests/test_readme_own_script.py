"""The README's "Your own training script": the script as written there, under ``torchrun`` with two
CPU processes, trains its three iterations."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.functional

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_script() -> str:
    section = README.read_text().split("## Your own training script", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readmes_own_script_trains_under_torchrun_on_the_cpu(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(readme_script())
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"iteration\s+3/3", proc.stdout + proc.stderr)
