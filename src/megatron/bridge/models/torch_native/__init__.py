"""Torch-native layer implementation for megatron-core without Transformer Engine.

SDPA core attention (:class:`TorchSDPAttention`) and grouped-GEMM routed experts
(:class:`TorchGroupedMLP`, ``torch._grouped_mm`` on Hopper bf16, a per-expert loop elsewhere),
plugged into megatron-core's ``TransformerLayer``/``MoELayer`` through its spec mechanism.
Select with ``model.layer_spec="torch_native"`` (``"auto"`` picks it unless a feature needs Transformer Engine).

Names are imported on first use, so that light modules of this package (``symmetric_exchange``,
read by the dispatch paths that validation imports on login nodes) do not pull in megatron's layers.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "TorchSDPAttention": "attention",
    "sdpa_core_attention": "attention",
    "SortedTokenDispatcher": "sorted_dispatcher",
    "TorchNativeMoELayer": "moe_layer",
    "TorchGroupedMLP": "experts",
    "grouped_linear": "grouped_gemm",
    "select_backend": "grouped_gemm",
    "get_torch_native_decoder_block_spec": "spec",
    "torch_native_layer_spec": "spec",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
