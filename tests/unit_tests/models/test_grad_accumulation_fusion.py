"""``model.gradient_accumulation_fusion`` without Apex: megatron-core's linear layers build and add
their weight gradient into ``main_grad`` through this package's kernel."""

from __future__ import annotations

import sys

import pytest
import torch
from megatron.core.tensor_parallel import layers

from megatron.bridge.models import grad_accumulation_fusion as gaf
from megatron.bridge.models.gpt_provider import GPTModelProvider


@pytest.fixture
def without_apex(monkeypatch):
    """megatron-core's view of a machine without Apex's extension, restored after the test."""
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", False)
    monkeypatch.setattr(layers, "fused_weight_gradient_mlp_cuda", None, raising=False)
    monkeypatch.delitem(sys.modules, gaf.KERNEL_MODULE, raising=False)
    monkeypatch.setattr(gaf, "_apex_kernel", lambda: None)


def _reference(x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    return dy.reshape(-1, dy.shape[-1]).double().t() @ x.reshape(-1, x.shape[-1]).double()


@pytest.mark.parametrize(
    "dtype, main_dtype, accumulate",
    [
        (torch.float32, torch.float32, gaf.wgrad_gemm_accum_fp32),
        (torch.bfloat16, torch.float32, gaf.wgrad_gemm_accum_fp32),
        (torch.bfloat16, torch.bfloat16, gaf.wgrad_gemm_accum_fp16),
    ],
)
def test_kernel_adds_the_weight_gradient_into_main_grad(dtype, main_dtype, accumulate):
    g = torch.Generator().manual_seed(0)
    x, dy = torch.randn(3, 5, 12, generator=g).to(dtype), torch.randn(3, 5, 7, generator=g).to(dtype)
    start = torch.randn(7, 12, generator=g).to(main_dtype)
    main_grad = start.clone()
    accumulate(x, dy, main_grad)
    want = start.double() + _reference(x, dy)
    tolerance = 1e-5 if main_dtype == torch.float32 else 2e-2
    assert main_grad.dtype == main_dtype
    assert float((main_grad.double() - want).abs().max() / want.abs().max()) < tolerance


def test_megatron_refuses_the_flag_without_a_kernel(without_apex, model_parallel):
    with pytest.raises(RuntimeError, match="fused_weight_gradient_mlp_cuda"):
        _column_linear()


def test_with_the_kernel_provided_megatrons_layer_trains_into_main_grad(without_apex, model_parallel):
    assert gaf.provide_missing_kernel() == gaf.THIS_PACKAGE
    assert sys.modules[gaf.KERNEL_MODULE] is gaf and layers.fused_weight_gradient_mlp_cuda is gaf
    linear = _column_linear()
    weight = linear.weight
    weight.main_grad = torch.zeros_like(weight, dtype=torch.float32)
    x = torch.randn(4, 2, 16)
    for _ in range(2):  # two micro-batches accumulate
        out, _ = linear(x)
        out.backward(torch.ones_like(out))
    assert weight.grad is None  # nothing left for DDP's hook to add
    want = 2 * _reference(x, torch.ones(4, 2, 24))
    torch.testing.assert_close(weight.main_grad.double(), want, rtol=1e-5, atol=1e-5)


def test_apex_when_present_is_kept(monkeypatch):
    apex = object()
    monkeypatch.setattr(gaf, "_apex_kernel", lambda: apex)
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", True)
    assert gaf.provide_missing_kernel() == gaf.APEX
    assert "Apex's" in gaf.describe("transformer_engine", "cuda")


@pytest.mark.parametrize(
    "layer_spec, device, words",
    [
        ("transformer_engine", "cuda", ["Transformer Engine's layers fuse", "cuBLAS GEMM"]),
        ("torch_native", "cuda", ["cuBLAS GEMM"]),
        ("local", "cpu", ["CPU"]),
    ],
)
def test_the_start_up_line_says_which_kernel(without_apex, layer_spec, device, words):
    model = GPTModelProvider(
        num_layers=1, hidden_size=8, num_attention_heads=1, layer_spec=layer_spec, gradient_accumulation_fusion=True
    )
    line = model.describe_gradient_accumulation_fusion(device)
    assert line.startswith("gradient accumulation fusion:") and all(w in line for w in words)
    assert ("Transformer Engine" in line) == (layer_spec == "transformer_engine")
    model.gradient_accumulation_fusion = False
    assert model.describe_gradient_accumulation_fusion(device) is None


def _column_linear() -> layers.ColumnParallelLinear:
    config = GPTModelProvider(
        num_layers=1,
        hidden_size=16,
        num_attention_heads=1,
        layer_spec="local",
        gradient_accumulation_fusion=True,
        use_cpu_initialization=True,
        perform_initialization=False,
        add_bias_linear=False,
    )
    return layers.ColumnParallelLinear(
        16, 24, config=config, init_method=torch.nn.init.zeros_, bias=False, gather_output=False
    )
