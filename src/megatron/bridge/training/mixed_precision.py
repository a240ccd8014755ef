"""Precision recipes. ``cfg.mixed_precision`` owns the precision flags of model, optimizer and DDP.

``cfg.mixed_precision`` is a recipe name (``"bf16_mixed"``) or a :class:`MixedPrecisionConfig`
object (``bf16``, ``fp16``, ``params_dtype``, ``grad_reduce_in_fp32``, ``fp8``, ``fp8_recipe``),
the two forms Megatron-Bridge scripts use. The flags on the model/optimizer/DDP configs
(:data:`PRECISION_TARGETS`) are derived from it when the tree is finalized.
``mixed_precision=None`` means no recipe: the flags are the user's own and stand as set.

This is the public import path; the parts live in the stages of
:mod:`megatron.bridge.training.config_stages`: the object, the recipe table and Megatron-Bridge's
recipe functions (``schema.mixed_precision_config``), which field each recipe sets
(``facts.mixed_precision_targets``), the rules (``rules.mixed_precision_rules``) and the step that
writes the flags (``resolution.mixed_precision_resolution``).
"""

from __future__ import annotations

from megatron.bridge.training.config_stages.facts.mixed_precision_targets import (
    LEFT_TO_USER,
    PRECISION_TARGETS,
    mixed_precision_recipe,
    precision_value,
)
from megatron.bridge.training.config_stages.resolution.mixed_precision_resolution import apply_mixed_precision
from megatron.bridge.training.config_stages.schema.mixed_precision_config import (
    MIXED_PRECISION_RECIPES,
    MixedPrecisionConfig,
    MixedPrecisionRecipe,
    MixedPrecisionSetting,
    RecipeTable,
    UnknownMixedPrecisionError,
    bf16_mixed,
    bf16_with_fp8_current_scaling_mixed,
    bf16_with_fp8_delayed_scaling_mixed,
    bf16_with_fp8_subchannel_scaling_mixed,
    bf16_with_mxfp8_mixed,
    bf16_with_nvfp4_mixed,
    canonical_name,
    fp16_mixed,
    fp16_with_fp8_current_scaling_mixed,
    fp16_with_fp8_delayed_scaling_mixed,
    fp16_with_fp8_subchannel_scaling_mixed,
    fp16_with_mxfp8_mixed,
    get_mixed_precision_config,
    is_known_setting,
    nanov2_bf16_with_fp8_current_scaling_mixed,
    nemotron_3_super_bf16_with_nvfp4_mixed,
    nemotron_h_bf16_with_fp8_current_scaling_mixed,
)

__all__ = [
    "LEFT_TO_USER",
    "MIXED_PRECISION_RECIPES",
    "PRECISION_TARGETS",
    "MixedPrecisionConfig",
    "MixedPrecisionRecipe",
    "MixedPrecisionSetting",
    "RecipeTable",
    "UnknownMixedPrecisionError",
    "apply_mixed_precision",
    "bf16_mixed",
    "bf16_with_fp8_current_scaling_mixed",
    "bf16_with_fp8_delayed_scaling_mixed",
    "bf16_with_fp8_subchannel_scaling_mixed",
    "bf16_with_mxfp8_mixed",
    "bf16_with_nvfp4_mixed",
    "canonical_name",
    "fp16_mixed",
    "fp16_with_fp8_current_scaling_mixed",
    "fp16_with_fp8_delayed_scaling_mixed",
    "fp16_with_fp8_subchannel_scaling_mixed",
    "fp16_with_mxfp8_mixed",
    "get_mixed_precision_config",
    "is_known_setting",
    "mixed_precision_recipe",
    "nanov2_bf16_with_fp8_current_scaling_mixed",
    "nemotron_3_super_bf16_with_nvfp4_mixed",
    "nemotron_h_bf16_with_fp8_current_scaling_mixed",
    "precision_value",
]
