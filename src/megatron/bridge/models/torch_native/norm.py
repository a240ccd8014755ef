"""RMSNorm for the torch-native spec: ``torch.nn.RMSNorm`` with a compiled, fused CUDA path.

Without Apex and Transformer Engine, megatron-core's norms are ``torch.nn.RMSNorm``, which runs as
its composite definition: upcast, pow, mean, add, rsqrt, two multiplies and a cast forward, and
about twice as many kernels backward, each a full pass over the activations. A Qwen3-MoE layer has
four of them (input, pre-MLP, query and key norms). On one H200 they were about a tenth of the
proxy's GPU time. Here the same arithmetic is compiled with ``torch.compile`` (one reduction
kernel forward, one backward plus the weight-gradient reduction).

The module is a ``torch.nn.RMSNorm`` (same ``weight`` parameter and checkpoint keys). CPU tensors,
and any compile failure (logged once), take the eager ``torch.nn.RMSNorm`` path.
``MBRIDGE_TORCH_NATIVE_COMPILE=0`` switches all torch-native compilation off.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_config import TransformerConfig

logger = logging.getLogger(__name__)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension, all arithmetic in fp32 (or wider) and one rounding to ``x``'s dtype
    at the end (what ``torch.nn.functional.rms_norm`` computes in current torch releases)."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (normed * weight.to(xf.dtype)).to(x.dtype)


_COMPILE_STATE: dict[str, Any] = {
    "fn": None,
    "disabled": os.environ.get("MBRIDGE_TORCH_NATIVE_COMPILE", "1") == "0",
}


def _compiled_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if _COMPILE_STATE["fn"] is None:
        _COMPILE_STATE["fn"] = torch.compile(rms_norm_reference, dynamic=False)
    return _COMPILE_STATE["fn"](x, weight, eps)


class FusedRMSNorm(torch.nn.RMSNorm):
    """``torch.nn.RMSNorm`` whose CUDA forward/backward are one compiled kernel each."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        if x.is_cuda and self.weight is not None and not _COMPILE_STATE["disabled"]:
            eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
            try:
                return _compiled_rms_norm(x, self.weight, eps)
            except Exception as exc:  # a compiler failure must not stop training: stay eager
                _COMPILE_STATE["disabled"] = True
                logger.warning("torch_native RMSNorm: torch.compile failed (%s); using eager ops", exc)
        return super().forward(x)


class TorchNativeNorm:
    """Spec slot replacing megatron-core's ``WrappedTorchNorm``: RMSNorm becomes
    :class:`FusedRMSNorm`; anything else is what ``WrappedTorchNorm`` builds."""

    def __new__(cls, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **kwargs: Any) -> torch.nn.Module:
        module = WrappedTorchNorm(config, hidden_size, eps, **kwargs)  # megatron's checks and choice
        if type(module) is not torch.nn.RMSNorm:
            return module
        return FusedRMSNorm(normalized_shape=hidden_size, eps=eps)
