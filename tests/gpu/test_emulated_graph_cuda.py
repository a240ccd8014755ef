"""An emulated EP=16 step captured in a whole-iteration CUDA graph, through the harness: the capture
succeeds, and every replayed step is charged the collectives an eager step is charged (the host
issues them once, at the capture; ``emulation/record.py`` counts them at each replay)."""

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
WARMUP, STEPS = 2, 5


ROUTED = ("ep[16]", "all_to_all")
"""The token exchange, tallied on the GPU: its bytes follow each step's routing, its calls do not."""


def _calls(step: dict) -> dict[tuple[str, str], tuple[int, ...]]:
    """A step's record without host times, the barriers around the capture, and routed bytes."""
    return {
        (group, kind): (t["calls"],) if (group, kind) == ROUTED else (t["calls"], t["bytes"], t["inter_node_bytes"])
        for group, kinds in step["groups"].items()
        for kind, t in kinds.items()
        if kind != "barrier"
    }


@pytest.mark.parametrize("overlap", ["false", "true"], ids=["overlap-off", "overlap-on"])
def test_a_captured_emulated_step_is_charged_at_every_replay_as_an_eager_step(tmp_path, overlap):
    from seed_command import TINY_SIZES, for_gpu

    gpu = gpu_type(torch.cuda.get_device_name(0))
    if gpu is None:
        pytest.skip(f"{torch.cuda.get_device_name(0)} is not one of the harness's -g GPU types")
    argv = [
        sys.executable,
        str(SCRIPT),
        *for_gpu(gpu.name),
        "--emulate",
        "--network",
        "h100_ib400",
        *TINY_SIZES,
        "--max_steps",
        str(STEPS),
        "-gb",
        "32",
        "--steady_state_window",
        f"{WARMUP + 2},{STEPS}",
        "model.torch_native_dispatcher=sorted",
        "model.torch_native_ep_transport=nvshmem",
        "--cuda_graph_impl",
        "full_iteration",
        f"model.cuda_graph_warmup_steps={WARMUP}",
        f"comm_overlap.overlap_moe_expert_parallel_comm={overlap}",
        "-l",
        str(tmp_path / "run"),
    ]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["cuda_graph"]["captured_iteration"] == WARMUP + 1
    assert all(math.isfinite(loss) for loss in summary["losses"])
    steps = {step["iteration"]: step for step in summary["emulation"]["steps"]}
    eager = _calls(steps[WARMUP])
    assert ROUTED in eager and ("ep[16]", "all_gather") in eager
    for iteration in range(WARMUP + 1, STEPS + 1):  # the capture step replays once too
        assert _calls(steps[iteration]) == eager, iteration
