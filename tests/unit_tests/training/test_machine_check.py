"""``pretrain()`` refuses a GPU config on a machine without a GPU before any process group or CUDA
call, in the harness's words (it died on every rank with "Found no NVIDIA driver")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent / "children" / "gpu_config_on_a_cpu_machine.py"


def test_a_gpu_config_without_a_gpu_is_refused_in_the_harness_words(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", WORLD_SIZE="1", RANK="0", LOCAL_RANK="0")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "refused: this machine has 0 visible GPU(s) but the run needs 1" in proc.stdout
    assert 'cfg.dist.device = "cpu"' in proc.stdout
    assert "NVIDIA driver" not in proc.stderr and "Traceback" not in proc.stderr
