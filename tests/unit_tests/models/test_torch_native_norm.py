"""The torch-native norm slot: RMSNorm becomes FusedRMSNorm (same parameters, same numbers on the
eager path), anything else is megatron-core's WrappedTorchNorm."""

from __future__ import annotations

import pytest
import torch

from megatron.bridge.models.torch_native import norm


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 0.0), (torch.bfloat16, 0.0)])
def test_reference_equals_torch_rms_norm(dtype, tol):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(5, 3, 64, generator=g) * 3).to(dtype)
    w = (torch.rand(64, generator=g) + 0.5).to(dtype)
    expected = torch.nn.functional.rms_norm(x, (64,), w, 1e-6)
    got = norm.rms_norm_reference(x, w, 1e-6)
    assert got.dtype == dtype
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)


def test_reference_gradients_equal_torch_rms_norm():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, 32, generator=g, dtype=torch.float64)
    w = torch.rand(32, generator=g, dtype=torch.float64) + 0.5
    grads = []
    for fn in (
        lambda a, b: torch.nn.functional.rms_norm(a, (32,), b, 1e-6),
        lambda a, b: norm.rms_norm_reference(a, b, 1e-6),
    ):
        a, b = x.clone().requires_grad_(), w.clone().requires_grad_()
        (fn(a, b) * torch.arange(32, dtype=torch.float64)).sum().backward()
        grads.append((a.grad, b.grad))
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.parametrize(
    "normalization, expected",
    [("RMSNorm", norm.FusedRMSNorm), ("LayerNorm", torch.nn.LayerNorm)],
)
def test_norm_slot_builds(tiny_moe_config, normalization, expected):
    module = norm.TorchNativeNorm(config=tiny_moe_config(normalization=normalization), hidden_size=32, eps=1e-6)
    assert type(module) is expected
    assert list(dict(module.named_parameters())) == list(dict(torch.nn.RMSNorm(32).named_parameters())) or (
        expected is torch.nn.LayerNorm
    )
    assert module.eps == 1e-6


def test_norm_slot_keeps_megatron_checks(tiny_moe_config):
    config = tiny_moe_config(normalization="RMSNorm")
    config.layernorm_zero_centered_gamma = True
    with pytest.raises(AssertionError, match="zero_centered_gamma"):
        norm.TorchNativeNorm(config=config, hidden_size=32)


def test_fused_module_matches_torch_rms_norm_on_cpu(tiny_moe_config):
    fused = norm.TorchNativeNorm(config=tiny_moe_config(normalization="RMSNorm"), hidden_size=32, eps=1e-6)
    plain = torch.nn.RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        fused.weight.uniform_(0.5, 1.5)
    plain.load_state_dict(fused.state_dict(), strict=True)
    x = torch.randn(4, 2, 32)
    torch.testing.assert_close(fused(x), plain(x), rtol=0, atol=0)
