"""``pretrain()`` on one GPU through the harness, as a user starts it: the layers ``auto`` picks, and
Transformer Engine's layer spec with gradient-accumulation fusion (where TE imports)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron.bridge.training.config_stages.facts.gpu_catalog import gpu_type

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "performance" / "run_script.py"
STEPS = 4


def train(log_dir: Path, *overrides: str) -> dict:
    """The tiny Qwen3-MoE recipe for a few steps on GPU 0; its ``summary.json`` and output."""
    gpu = gpu_type(torch.cuda.get_device_name(0))
    if gpu is None:
        pytest.skip(f"{torch.cuda.get_device_name(0)} is not one of the harness's -g GPU types")
    argv = [
        sys.executable,
        str(SCRIPT),
        "-m",
        "qwen",
        "-mr",
        "qwen3_moe_tiny",
        "--task",
        "pretrain",
        "-g",
        gpu.name,
        "-c",
        "bf16",
        "-ng",
        "1",
        "-ep",
        "1",
        "--max_steps",
        str(STEPS),
        "--steady_state_window",
        f"2,{STEPS}",
        "-l",
        str(log_dir),
        *overrides,
    ]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads((log_dir / "summary.json").read_text())
    assert len(summary["losses"]) == STEPS and all(math.isfinite(x) for x in summary["losses"])
    return dict(summary, stdout=proc.stdout)


def test_auto_trains_the_torch_native_layers_with_gradient_accumulation_fusion(tmp_path):
    run = train(tmp_path / "auto", "model.gradient_accumulation_fusion=true")
    assert run["layer_spec"] == "torch_native" and run["layer_spec_reason"].startswith("auto:")
    assert f"layer spec: torch_native ({run['layer_spec_reason']})" in run["stdout"]
    fusion = run["gradient_accumulation_fusion"]
    assert fusion["enabled"] and "megatron-core's linear layers add into main_grad" in fusion["description"]


def test_transformer_engine_layers_train_with_gradient_accumulation_fusion_and_te_kernels(tmp_path, needs_te):
    run = train(
        tmp_path / "te",
        "model.layer_spec=transformer_engine",
        "model.gradient_accumulation_fusion=true",
        "model.moe_permute_fusion=true",
        "model.cross_entropy_fusion_impl=te",
    )
    assert run["layer_spec"] == "transformer_engine" and run["layer_spec_reason"] == "requested"
    assert "Transformer Engine's layers fuse into main_grad" in run["gradient_accumulation_fusion"]["description"]
    assert "loss: megatron-core fused cross-entropy (te)" in run["stdout"]
