"""Torch-native layer implementation for megatron-core without Transformer Engine.

SDPA core attention (:class:`TorchSDPAttention`) and grouped-GEMM routed experts
(:class:`TorchGroupedMLP`, ``torch._grouped_mm`` on Hopper bf16, a per-expert loop elsewhere),
plugged into megatron-core's ``TransformerLayer``/``MoELayer`` through its spec mechanism.
Select with ``model.layer_spec="torch_native"`` (``"auto"`` picks it when TE is absent).
"""

from megatron.bridge.models.torch_native.attention import TorchSDPAttention, sdpa_core_attention
from megatron.bridge.models.torch_native.dispatcher import SortedTokenDispatcher, TorchNativeMoELayer
from megatron.bridge.models.torch_native.experts import TorchGroupedMLP
from megatron.bridge.models.torch_native.grouped_gemm import grouped_linear, select_backend
from megatron.bridge.models.torch_native.spec import (
    get_torch_native_decoder_block_spec,
    torch_native_layer_spec,
)

__all__ = [
    "TorchSDPAttention",
    "SortedTokenDispatcher",
    "TorchGroupedMLP",
    "TorchNativeMoELayer",
    "get_torch_native_decoder_block_spec",
    "grouped_linear",
    "sdpa_core_attention",
    "select_backend",
    "torch_native_layer_spec",
]
