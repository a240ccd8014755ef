"""Performance benchmark recipes of every model family, importable from one place.

A package laid out as Megatron-Bridge's is: ``perf_recipes.<family>.<gpu>.<module>`` (for example
``megatron.bridge.perf_recipes.qwen.h100.qwen3_moe``), with each family's names also importable from
``perf_recipes.<family>`` and from here. Every name is the function of the family's ``*_perf`` recipe
module (``megatron.bridge.recipes.qwen.qwen3_moe_perf`` for Qwen3-MoE): all import paths give the
same function, and every call returns a new ``ConfigContainer``.
"""

from __future__ import annotations

from megatron.bridge.perf_recipes.qwen import (
    qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config,
    qwen3_30b_a3b_pretrain_16gpu_h200_bf16_config,
)

__all__ = [
    "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config",
    "qwen3_30b_a3b_pretrain_16gpu_h200_bf16_config",
]
