"""RMSNorm for the torch-native spec: ``torch.nn.RMSNorm`` with a compiled, fused CUDA path.

Without Apex and Transformer Engine, megatron-core's norms are ``torch.nn.RMSNorm``, which runs as
its composite definition: upcast, pow, mean, add, rsqrt, two multiplies and a cast forward, and
about twice as many kernels backward, each a full pass over the activations. A Qwen3-MoE layer has
four of them (input, pre-MLP, query and key norms; their share of a step:
``docs/benchmarks/implementation_costs.md``). Here the same arithmetic is compiled with ``torch.compile`` (one reduction
kernel forward, one backward plus the weight-gradient reduction).

The module is a ``torch.nn.RMSNorm`` (same ``weight`` parameter and checkpoint keys). CPU tensors,
and any compile failure (see ``compiled.py``), take the eager ``torch.nn.RMSNorm`` path.
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron.bridge.models.torch_native.compiled import LazyCompiled


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension, all arithmetic in fp32 (or wider) and one rounding to ``x``'s dtype
    at the end (what ``torch.nn.functional.rms_norm`` computes in current torch releases)."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (normed * weight.to(xf.dtype)).to(x.dtype)


_COMPILED_RMS_NORM = LazyCompiled(rms_norm_reference, "RMSNorm", dynamic=False)


class FusedRMSNorm(torch.nn.RMSNorm):
    """``torch.nn.RMSNorm`` whose CUDA forward/backward are one compiled kernel each."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        if x.is_cuda and self.weight is not None:
            eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
            return _COMPILED_RMS_NORM(self._eager, x, self.weight, eps)
        return super().forward(x)

    def _eager(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """torch's own RMSNorm (``weight`` and ``eps`` are this module's)."""
        return super().forward(x)


class TorchNativeNorm:
    """Spec slot replacing megatron-core's ``WrappedTorchNorm``: RMSNorm becomes
    :class:`FusedRMSNorm`; anything else is what ``WrappedTorchNorm`` builds."""

    def __new__(cls, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **kwargs: Any) -> torch.nn.Module:
        module = WrappedTorchNorm(config, hidden_size, eps, **kwargs)  # megatron's checks and choice
        if type(module) is not torch.nn.RMSNorm:
            return module
        return FusedRMSNorm(normalized_shape=hidden_size, eps=eps)
