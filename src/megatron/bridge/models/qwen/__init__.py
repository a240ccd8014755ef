"""Qwen3 mixture-of-experts providers."""

from megatron.bridge.models.qwen.qwen3_moe_provider import (
    Qwen3MoEModelProvider,
    Qwen3MoEModelProvider30B_A3B,
    Qwen3MoEModelProvider235B_A22B,
)

__all__ = ["Qwen3MoEModelProvider", "Qwen3MoEModelProvider30B_A3B", "Qwen3MoEModelProvider235B_A22B"]
