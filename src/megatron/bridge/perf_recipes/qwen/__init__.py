"""Qwen3-MoE performance benchmark recipes, by GPU type (``h100``, ``h200``)."""

from __future__ import annotations

from megatron.bridge.perf_recipes.qwen.h100.qwen3_moe import qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config
from megatron.bridge.perf_recipes.qwen.h200.qwen3_moe import qwen3_30b_a3b_pretrain_16gpu_h200_bf16_config

__all__ = [
    "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config",
    "qwen3_30b_a3b_pretrain_16gpu_h200_bf16_config",
]
