"""Named precision recipes. ``cfg.mixed_precision`` owns the precision flags of model, optimizer and DDP.

The flags on the model/optimizer/DDP configs (:data:`PRECISION_TARGETS`) are derived from the name
when the tree is finalized. ``mixed_precision=None`` means no recipe: the flags are the user's own
and stand as set (as in upstream Megatron-Bridge).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer


@dataclass(frozen=True)
class MixedPrecisionRecipe:
    """What one named precision means for the three configs it drives."""

    bf16: bool
    fp16: bool
    params_dtype: torch.dtype
    grad_reduce_in_fp32: bool
    fp8: Optional[str] = None
    fp8_recipe: Optional[str] = None

    @property
    def needs_transformer_engine(self) -> bool:
        """FP8 compute exists only in Transformer Engine."""
        return self.fp8 is not None


MIXED_PRECISION_RECIPES: dict[str, MixedPrecisionRecipe] = {
    "bf16_mixed": MixedPrecisionRecipe(True, False, torch.bfloat16, True),
    "fp16_mixed": MixedPrecisionRecipe(False, True, torch.half, False),
    "fp32": MixedPrecisionRecipe(False, False, torch.float32, False),
    "bf16_with_fp8_delayed_scaling_mixed": MixedPrecisionRecipe(
        True, False, torch.bfloat16, True, fp8="hybrid", fp8_recipe="delayed"
    ),
    "bf16_with_fp8_current_scaling_mixed": MixedPrecisionRecipe(
        True, False, torch.bfloat16, True, fp8="hybrid", fp8_recipe="tensorwise"
    ),
    "bf16_with_mxfp8_mixed": MixedPrecisionRecipe(
        True, False, torch.bfloat16, True, fp8="e4m3", fp8_recipe="mxfp8"
    ),
}


PRECISION_TARGETS: dict[str, str] = {
    "model.bf16": "bf16",
    "model.fp16": "fp16",
    "model.params_dtype": "params_dtype",
    "model.pipeline_dtype": "params_dtype",
    "model.fp8": "fp8",
    "model.fp8_recipe": "fp8_recipe",
    "optimizer.bf16": "bf16",
    "optimizer.fp16": "fp16",
    "optimizer.params_dtype": "params_dtype",
    "ddp.grad_reduce_in_fp32": "grad_reduce_in_fp32",
}
"""Field a recipe sets -> the recipe attribute it takes."""

LEFT_TO_USER = object()
"""What :func:`precision_value` returns for a field the recipe does not set."""


def mixed_precision_recipe(name: Optional[str]) -> Optional[MixedPrecisionRecipe]:
    """The recipe for ``name``, or ``None`` for no recipe or an unknown name (a rule reports that)."""
    return MIXED_PRECISION_RECIPES.get(name) if name is not None else None


def precision_value(name: Optional[str], target: str) -> Any:
    """What recipe ``name`` sets ``target`` to, or :data:`LEFT_TO_USER`: no recipe (``None``, or an
    unknown name), or ``fp8_recipe`` under a recipe without FP8."""
    recipe = mixed_precision_recipe(name)
    if recipe is None:
        return LEFT_TO_USER
    value = getattr(recipe, PRECISION_TARGETS[target])
    return LEFT_TO_USER if value is None and target == "model.fp8_recipe" else value


def apply_mixed_precision(cfg: "ConfigContainer") -> None:
    """Derive the precision flags of ``cfg.model``, ``cfg.optimizer`` and ``cfg.ddp`` from the name."""
    for target in PRECISION_TARGETS:
        value = precision_value(cfg.mixed_precision, target)
        if value is not LEFT_TO_USER:
            holder, _, name = target.rpartition(".")
            setattr(getattr(cfg, holder), name, value)
