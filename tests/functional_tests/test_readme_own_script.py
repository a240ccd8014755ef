"""The README's "Your own training script": the script as written there, under ``torchrun`` with two
CPU processes, trains its three iterations and ends as a harness run does: the Results table last,
the CPU smoke-mode notice once, megatron-core's known notices not at all, a loss curve beside
``summary.json``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.functional

README = Path(__file__).resolve().parents[2] / "README.md"
KNOWN_NOISE = (
    "GPTModel IS DEPRECATED",
    "Unable to save MockGPTDataset indexes",
    "Rerun State Machine",
    "RerunStateMachine initialized",
    "full_param_layout not provided",
)
"""megatron-core's notices that repeat on every rank and need no action (``utils/quiet.py``)."""


def readme_script() -> str:
    section = README.read_text().split("## Your own training script", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def own_run(tmp_path_factory) -> subprocess.CompletedProcess:
    tmp_path = tmp_path_factory.mktemp("own_script")
    script = tmp_path / "train.py"
    script.write_text(readme_script())
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_the_readmes_own_script_trains_under_torchrun_on_the_cpu(own_run):
    assert re.search(r"iteration\s+3/3", own_run.stdout + own_run.stderr)


def test_it_ends_with_the_results_table_and_its_loss_curve(own_run):
    out = own_run.stdout.rstrip().splitlines()
    assert out[-1].startswith("-----") and any(line.startswith("Results") for line in out[-20:]), out[-20:]
    summary = next(line.split()[-1] for line in out if re.match(r"summary {2,}\S", line))
    assert summary.endswith("summary.json") and Path(summary).is_file()
    assert (Path(summary).parent / "loss.png").is_file()
    assert "CPU smoke mode" in "\n".join(out[-20:])  # the table says what its numbers are


def test_the_cpu_notice_is_said_once_with_its_prefix_and_known_noise_not_at_all(own_run):
    everything = own_run.stdout + own_run.stderr
    notices = [line for line in everything.splitlines() if "megatron-core CUDA calls mapped to CPU" in line]
    assert len(notices) == 1 and notices[0].startswith("[megatron.bridge] CPU smoke mode"), notices
    for noise in KNOWN_NOISE:
        assert noise not in everything, noise
