"""megatron-core's fine-grained activation offloading through the harness on one GPU, without
Transformer Engine: the attention and norm inputs of megatron-core's local layers (the norm inputs of
the torch-native layers) go to host memory and come back, and the run trains as it does without
offloading (the same losses bit for bit), under the standard schedule and under EP overlap (two
ranks sharing the GPU over gloo).

On an H200 (torch 2.11, megatron-core 0.19.2, no TE) the local cases gave identical losses with
0.66 MB (one rank) and 1.32 MB (two ranks) offloaded per step; the torch-native norms-only case is
the configuration the rules accept for those layers (its losses matched in a two-step run).
"""

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
OFFLOAD = (
    "model.fine_grained_activation_offloading=true",
    "model.min_offloaded_tensor_size=0",  # the tiny model's activations are below the 1 MiB default
)
MODULES = {  # what each layer spec trains with (the rules refuse the torch-native attention's inputs)
    "local": "model.offload_modules=[attn_norm,qkv_linear,core_attn,attn_proj,mlp_norm]",
    "torch_native": "model.offload_modules=[attn_norm,mlp_norm]",
}
EP_OVERLAP_ON_ONE_GPU = ("--procs_per_gpu", "2", "-ep", "2", "--moe_a2a_overlap", "true")


def train(log_dir: Path, *overrides: str) -> dict:
    """The tiny Qwen3-MoE recipe for a few steps on GPU 0: its ``summary.json``, output and launch log."""
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


@pytest.mark.parametrize(
    "layer_spec, schedule",
    [("local", ()), ("local", EP_OVERLAP_ON_ONE_GPU), ("torch_native", ())],
    ids=["local-standard", "local-ep-overlap", "torch_native-standard"],
)
def test_offloading_attention_and_norm_inputs_trains_as_without_it(tmp_path, layer_spec, schedule):
    spec = f"model.layer_spec={layer_spec}"
    plain = train(tmp_path / "plain", spec, *schedule)
    offloaded = train(tmp_path / "offloaded", spec, *schedule, *OFFLOAD, MODULES[layer_spec])
    assert offloaded["losses"] == pytest.approx(plain["losses"], rel=0, abs=0)
    record = offloaded["activation_offload"]  # megatron-core's own count, kept in summary.json
    assert record["bytes_per_step"] > 0 and record["bytes_per_step"] == sum(record["by_module"].values())
    assert plain["activation_offload"] is None
    assert "activation_offload" in offloaded["stdout"].split("active:", 1)[1].splitlines()[0]
