"""The sequential coalescing manager used for gloo on CUDA tensors."""

import pytest
import torch
import torch.distributed as dist

from megatron.bridge.training.devices.gloo_cuda_compat import sequential_coalescing_manager


def test_collectives_inside_run_immediately_and_wait_is_harmless(gloo_world):
    tensors = [torch.full((4,), 2.0), torch.full((3,), 5.0)]
    with sequential_coalescing_manager(None, async_ops=False) as cm:
        for t in tensors:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        # Each collective already ran: nothing is deferred to the end of the block.
        assert torch.equal(tensors[0], torch.full((4,), 2.0))
    cm.wait()
    assert torch.equal(tensors[1], torch.full((3,), 5.0))


def test_asynchronous_use_is_refused_with_the_fix():
    with pytest.raises(RuntimeError, match="overlap_grad_reduce=false"):
        with sequential_coalescing_manager(None, async_ops=True):
            pass


def test_enable_swaps_megatrons_manager():
    from megatron.core.distributed import param_and_grad_buffer

    from megatron.bridge.training.devices import gloo_cuda_compat

    original = param_and_grad_buffer._coalescing_manager
    try:
        gloo_cuda_compat.enable_gloo_cuda_compat()
        assert param_and_grad_buffer._coalescing_manager is sequential_coalescing_manager
        assert gloo_cuda_compat.gloo_cuda_compat_enabled()
    finally:
        param_and_grad_buffer._coalescing_manager = original
        gloo_cuda_compat._ENABLED = False
