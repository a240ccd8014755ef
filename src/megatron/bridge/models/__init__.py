"""Model providers (megatron-core ``TransformerConfig`` subclasses that build models) and layer specs."""

from megatron.bridge.models.gpt_provider import GPTModelProvider
from megatron.bridge.models.qwen import (
    Qwen3MoEModelProvider,
    Qwen3MoEModelProvider30B_A3B,
    Qwen3MoEModelProvider235B_A22B,
)

__all__ = [
    "GPTModelProvider",
    "Qwen3MoEModelProvider",
    "Qwen3MoEModelProvider30B_A3B",
    "Qwen3MoEModelProvider235B_A22B",
]
