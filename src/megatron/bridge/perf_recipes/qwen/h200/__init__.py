"""Qwen3-MoE performance benchmark recipes for H200 GPUs."""

from __future__ import annotations

from megatron.bridge.perf_recipes.qwen.h200.qwen3_moe import qwen3_30b_a3b_pretrain_16gpu_h200_bf16_config

__all__ = ["qwen3_30b_a3b_pretrain_16gpu_h200_bf16_config"]
