"""Qwen3-MoE performance benchmark recipes for H100 GPUs."""

from __future__ import annotations

from megatron.bridge.perf_recipes.qwen.h100.qwen3_moe import qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config

__all__ = ["qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config"]
