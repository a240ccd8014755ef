"""Qwen3-MoE pretraining recipes."""

from megatron.bridge.recipes.qwen.qwen3_moe import (
    qwen3_30b_a3b_pretrain_8gpu_config,
    qwen3_30b_a3b_pretrain_config,
    qwen3_235b_a22b_pretrain_config,
    qwen3_moe_tiny_pretrain_config,
)

__all__ = [
    "qwen3_30b_a3b_pretrain_config",
    "qwen3_30b_a3b_pretrain_8gpu_config",
    "qwen3_235b_a22b_pretrain_config",
    "qwen3_moe_tiny_pretrain_config",
]
