"""Fused expert weight-gradient accumulation into DDP's fp32 ``main_grad``.

The Triton kernel runs here through Triton's CPU interpreter (a child process: the switch must be
set before Triton is imported); on GPUs the start-up line and ``summary.json`` name the path.
"""

from pathlib import Path

import pytest
import torch

from megatron.bridge.models.torch_native.grouped_gemm import grouped_linear

CHILD = Path(__file__).parent / "children" / "wgrad_accumulate_interpreted.py"


@pytest.fixture(scope="module")
def interpreted_report(run_interpreted_child) -> dict:
    return run_interpreted_child(CHILD)


@pytest.mark.parametrize(
    "case", ["uneven_with_empty_expert_and_padding", "fp32_single_row_experts", "all_experts_empty"]
)
def test_kernel_adds_each_experts_rows_into_main_grad(interpreted_report, case):
    assert interpreted_report["kernel"][case] < 1e-5


@pytest.mark.parametrize(
    "path, fused", [("fused", True), ("fused_deferred", True), ("unfused", False), ("unfused_deferred", False)]
)
def test_backward_gradients_reach_main_grad_once(interpreted_report, path, fused):
    """Fused, the gradient is in main_grad and DDP's hook is told to skip its add; unfused, the hook adds."""
    result = interpreted_report["backward"][path]
    assert result["flag"] is fused
    assert result["error"] < 1e-6


def test_fused_needs_an_fp32_main_grad(interpreted_report):
    assert interpreted_report["can_fuse_cpu_fp32"] and not interpreted_report["can_fuse_cpu_bf16"]


def test_explicit_fused_refuses_a_main_grad_it_cannot_fill():
    weight = torch.nn.Parameter(torch.randn(2, 8, 4))
    weight.main_grad = torch.zeros(2, 8, 4, dtype=torch.bfloat16)
    out = grouped_linear(torch.randn(6, 4), weight, torch.tensor([2, 4]), "loop", None, "fused")
    with pytest.raises(RuntimeError, match="torch_native_wgrad_accumulation='fused'.*bfloat16"):
        out.sum().backward()


def test_auto_without_a_fusable_main_grad_leaves_the_gradient_to_ddp():
    weight = torch.nn.Parameter(torch.randn(2, 8, 4))
    weight.main_grad = torch.zeros(2, 8, 4, dtype=torch.bfloat16)
    grouped_linear(torch.randn(6, 4), weight, torch.tensor([2, 4]), "loop", None, "auto").sum().backward()
    assert weight.grad is not None and weight.grad.abs().sum() > 0
    assert not getattr(weight, "grad_added_to_main_grad", False)
    assert weight.main_grad.abs().sum() == 0
