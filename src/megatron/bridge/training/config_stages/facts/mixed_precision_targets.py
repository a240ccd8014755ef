"""Which megatron-core fields a precision recipe sets, and to what.

The flags on the model, optimizer and DDP configs (:data:`PRECISION_TARGETS`) are copies owned by
``cfg.mixed_precision``: :func:`precision_value` says what a setting makes of each one, for the
ownership table (``facts.ownership``), the rules and the resolution that writes them.
"""

from __future__ import annotations

from typing import Any

from megatron.bridge.training.config_stages.schema.mixed_precision_config import (
    MIXED_PRECISION_RECIPES,
    MixedPrecisionConfig,
    MixedPrecisionSetting,
    canonical_name,
)

PRECISION_TARGETS: dict[str, str] = {
    "model.bf16": "bf16",
    "model.fp16": "fp16",
    "model.params_dtype": "params_dtype",
    "model.pipeline_dtype": "pipeline_dtype",
    "model.fp8": "fp8",
    "model.fp8_recipe": "fp8_recipe",
    "model.first_last_layers_bf16": "first_last_layers_bf16",
    "model.num_layers_at_start_in_bf16": "num_layers_at_start_in_bf16",
    "model.num_layers_at_end_in_bf16": "num_layers_at_end_in_bf16",
    "model.fp8_margin": "fp8_margin",
    "model.fp8_amax_history_len": "fp8_amax_history_len",
    "model.fp8_amax_compute_algo": "fp8_amax_compute_algo",
    "model.fp4": "fp4",
    "model.fp4_recipe": "fp4_recipe",
    "optimizer.bf16": "bf16",
    "optimizer.fp16": "fp16",
    "optimizer.params_dtype": "params_dtype",
    "ddp.grad_reduce_in_fp32": "grad_reduce_in_fp32",
}
"""Field a recipe sets -> the recipe attribute it takes."""

LEFT_TO_USER = object()
"""What :func:`precision_value` returns for a field the recipe does not set."""


def mixed_precision_recipe(setting: MixedPrecisionSetting) -> MixedPrecisionConfig | None:
    """The recipe ``setting`` (a name or an object) stands for, its dtypes decided (the table's
    read-only record for a name); ``None`` for no recipe or an unknown name (a rule reports that)."""
    if isinstance(setting, MixedPrecisionConfig):
        return setting.as_recipe()
    return MIXED_PRECISION_RECIPES.get(canonical_name(setting)) if isinstance(setting, str) else None


def precision_value(name: MixedPrecisionSetting, target: str) -> Any:
    """What recipe ``name`` sets ``target`` to, or :data:`LEFT_TO_USER`: no recipe (``None``, or an
    unknown name), or ``fp8_recipe`` under a recipe without FP8."""
    recipe = mixed_precision_recipe(name)
    if recipe is None:
        return LEFT_TO_USER
    value = getattr(recipe, PRECISION_TARGETS[target])
    return LEFT_TO_USER if value is None and target == "model.fp8_recipe" else value
