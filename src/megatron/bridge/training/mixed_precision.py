"""Precision recipes. ``cfg.mixed_precision`` owns the precision flags of model, optimizer and DDP.

``cfg.mixed_precision`` is a recipe name (``"bf16_mixed"``) or a :class:`MixedPrecisionConfig`
object (``bf16``, ``fp16``, ``params_dtype``, ``grad_reduce_in_fp32``, ``fp8``, ``fp8_recipe``),
the two forms Megatron-Bridge scripts use. The flags on the model/optimizer/DDP configs
(:data:`PRECISION_TARGETS`) are derived from it when the tree is finalized.
``mixed_precision=None`` means no recipe: the flags are the user's own and stand as set.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union

import torch

from megatron.bridge.training.strict_fields import StrictFields

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


@dataclass(kw_only=True)
class MixedPrecisionConfig(StrictFields):
    """A precision recipe as an object: set ``cfg.mixed_precision`` to one, or edit the fields of the
    one :meth:`from_name` gives. It owns the same flags a recipe name does."""

    bf16: bool = False
    fp16: bool = False
    params_dtype: Optional[torch.dtype] = None
    """``None``: ``torch.bfloat16`` with ``bf16``, ``torch.half`` with ``fp16``, else ``torch.float32``."""
    grad_reduce_in_fp32: bool = True
    fp8: Optional[str] = None
    """FP8 compute format (``hybrid``, ``e4m3``); needs Transformer Engine."""
    fp8_recipe: Optional[str] = None

    @classmethod
    def from_name(cls, name: str) -> "MixedPrecisionConfig":
        """The object form of the named recipe (``KeyError`` for an unknown name)."""
        return cls(**dataclasses.asdict(MIXED_PRECISION_RECIPES[name]))

    def as_recipe(self) -> MixedPrecisionRecipe:
        """What this object means for the configs it drives."""
        dtype = self.params_dtype
        if dtype is None:
            dtype = torch.bfloat16 if self.bf16 else torch.half if self.fp16 else torch.float32
        return MixedPrecisionRecipe(
            self.bf16, self.fp16, dtype, self.grad_reduce_in_fp32, fp8=self.fp8, fp8_recipe=self.fp8_recipe
        )


MixedPrecisionSetting = Union[str, MixedPrecisionConfig, None]
"""What ``cfg.mixed_precision`` holds: a recipe name, an object, or ``None`` (no recipe)."""


def get_mixed_precision_config(name: str) -> MixedPrecisionConfig:
    """The object form of the recipe called ``name`` (to edit before assigning it)."""
    return MixedPrecisionConfig.from_name(name)


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


def mixed_precision_recipe(setting: MixedPrecisionSetting) -> Optional[MixedPrecisionRecipe]:
    """The recipe ``setting`` (a name or an object) stands for; ``None`` for no recipe or an unknown
    name (a rule reports that)."""
    if isinstance(setting, MixedPrecisionConfig):
        return setting.as_recipe()
    return MIXED_PRECISION_RECIPES.get(setting) if setting is not None else None


def is_known_setting(setting: Any) -> bool:
    """``None``, a recipe name this package defines, or a :class:`MixedPrecisionConfig`."""
    return setting is None or isinstance(setting, MixedPrecisionConfig) or setting in MIXED_PRECISION_RECIPES


def precision_value(name: MixedPrecisionSetting, target: str) -> Any:
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
