"""Qwen3-MoE performance benchmark recipes for H100 GPUs: the functions of
``megatron.bridge.recipes.qwen.qwen3_moe_perf``, at the import path Megatron-Bridge uses."""

from __future__ import annotations

from megatron.bridge.recipes.qwen.qwen3_moe_perf import qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config

__all__ = ["qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config"]
