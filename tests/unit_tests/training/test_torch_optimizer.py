"""The torch stand-ins for Apex/TE multi-tensor kernels match megatron's local fallbacks."""

import pytest
import torch
from megatron.core.utils import local_multi_tensor_l2_norm, local_multi_tensor_scale

from megatron.bridge.training.devices import torch_optimizer


@pytest.fixture()
def tensors():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(5, 3, generator=g), torch.randn(7, generator=g), torch.randn(2, 2, 2, generator=g)]


def test_foreach_l2_norm_equals_the_local_fallback(tensors, monkeypatch):
    monkeypatch.setattr(torch, "tensor", _cpu_tensor(torch.tensor))  # the fallback puts its result on "cuda"
    expected, _ = local_multi_tensor_l2_norm(0, None, [tensors], False)
    got, per_tensor = torch_optimizer._foreach_l2_norm(0, None, [tensors], False)
    assert per_tensor is None
    torch.testing.assert_close(got, expected.to(got.dtype))


def _cpu_tensor(original):
    def make(*args, **kwargs):
        kwargs.pop("device", None)
        return original(*args, **kwargs)

    return make


@pytest.mark.parametrize("in_place", [True, False])
def test_foreach_scale_equals_the_local_fallback(tensors, in_place):
    expected = [t.clone() for t in tensors]
    local_multi_tensor_scale(0, None, [expected, expected], 0.25)
    src = [t.clone() for t in tensors]
    dst = src if in_place else [torch.zeros_like(t) for t in tensors]
    torch_optimizer._foreach_scale(0, None, [src, dst], 0.25)
    for a, b in zip(dst, expected):
        torch.testing.assert_close(a, b)


def test_cpu_parameters_are_never_switched_to_fused_adam():
    params = [torch.nn.Parameter(torch.randn(3))]

    class Wrapper:  # megatron's optimizers hold the torch optimizer as ``.optimizer``
        optimizer = torch.optim.AdamW(params, lr=1e-3)

    assert torch_optimizer.fuse_torch_adam(Wrapper()) == 0
    assert not Wrapper.optimizer.param_groups[0].get("fused")


def test_step_counters_restored_on_the_cpu_move_to_the_parameters_device():
    p = torch.nn.Parameter(torch.randn(2))
    opt = torch.optim.AdamW([p])
    opt.param_groups[0]["fused"] = True
    opt.state[p]["step"] = 3.0  # as a restored checkpoint may hold it
    torch_optimizer._step_counters_on_device(opt, (), {})
    assert torch.is_tensor(opt.state[p]["step"]) and opt.state[p]["step"].device == p.device
    assert float(opt.state[p]["step"]) == 3.0
