"""Named precision recipes. ``cfg.mixed_precision`` owns the precision flags of model, optimizer and DDP.

The flags on the model/optimizer/DDP configs are derived from the name when the tree is finalized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

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


def mixed_precision_recipe(name: str) -> Optional[MixedPrecisionRecipe]:
    """The recipe for ``name``, or ``None`` when unknown (a validation rule reports that)."""
    return MIXED_PRECISION_RECIPES.get(name)


def apply_mixed_precision(cfg: "ConfigContainer") -> None:
    """Derive the precision flags of ``cfg.model``, ``cfg.optimizer`` and ``cfg.ddp`` from the name."""
    recipe = mixed_precision_recipe(cfg.mixed_precision)
    if recipe is None:
        return
    for target in (cfg.model, cfg.optimizer):
        target.bf16 = recipe.bf16
        target.fp16 = recipe.fp16
        target.params_dtype = recipe.params_dtype
    cfg.model.pipeline_dtype = recipe.params_dtype
    cfg.model.fp8 = recipe.fp8
    if recipe.fp8_recipe is not None:
        cfg.model.fp8_recipe = recipe.fp8_recipe
    cfg.ddp.grad_reduce_in_fp32 = recipe.grad_reduce_in_fp32
