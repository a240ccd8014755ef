"""The gradient NaN/Inf check a captured run does after each step's backward (``ddp.check_for_nan_in_grad``).

The chunks here stand in for megatron-core's DDP wrapper: the check reads only its two lists of
gradient buffers (``buffers``, ``expert_parallel_buffers``) and each buffer's ``grad_data``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from megatron.bridge.training.loop.grad_check import NonFiniteGradientError, raise_for_nonfinite_grads


def _chunk(dense: int = 1, expert: int = 1, dtype=torch.float32) -> SimpleNamespace:
    def buffers(n):
        return [SimpleNamespace(grad_data=torch.randn(64).to(dtype)) for _ in range(n)]

    return SimpleNamespace(buffers=buffers(dense), expert_parallel_buffers=buffers(expert))


@pytest.mark.parametrize(
    "where,value,named",
    [
        ("buffers", float("nan"), "model chunk 1, dense gradient buffer 0"),
        ("buffers", float("inf"), "model chunk 1, dense gradient buffer 0"),
        ("expert_parallel_buffers", float("-inf"), "model chunk 1, expert-parallel gradient buffer 0"),
        ("expert_parallel_buffers", float("nan"), "model chunk 1, expert-parallel gradient buffer 0"),
    ],
)
def test_a_nonfinite_gradient_stops_the_step_naming_its_buffer(where, value, named):
    chunks = [_chunk(), _chunk(dtype=torch.bfloat16)]
    getattr(chunks[1], where)[0].grad_data[7] = value
    with pytest.raises(NonFiniteGradientError) as err:
        raise_for_nonfinite_grads(chunks, iteration=5)
    assert "iteration 5" in str(err.value) and named in str(err.value)
    assert str(err.value).count("gradient buffer") == 1  # only the bad one
    assert "optimizer step was not taken" in str(err.value)


@pytest.mark.parametrize("chunks", [[_chunk()], [_chunk(2, 0), _chunk(0, 3, torch.bfloat16)], [_chunk(0, 0)]])
def test_finite_gradients_pass(chunks):
    raise_for_nonfinite_grads(chunks, iteration=1)
