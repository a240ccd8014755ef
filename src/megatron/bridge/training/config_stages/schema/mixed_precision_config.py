"""What ``cfg.mixed_precision`` holds: a recipe name (``"bf16_mixed"``), a :class:`MixedPrecisionConfig`
object, or ``None`` (no recipe: the dtype flags of model, optimizer and DDP are the user's own).

One record, :class:`MixedPrecisionConfig`, is both the object a user edits and what the recipe table
(:data:`MIXED_PRECISION_RECIPES`) holds under each name; the table's records are read-only, and
:meth:`MixedPrecisionConfig.from_name`, :func:`get_mixed_precision_config` and Megatron-Bridge's recipe
functions (``bf16_mixed()``, ...) give a new copy to edit. Public import path:
:mod:`megatron.bridge.training.mixed_precision`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from megatron.bridge.training.errors import ConfigError, Violation, did_you_mean
from megatron.bridge.utils.strict_fields import StrictFields


def canonical_name(name: str) -> str:
    """``bf16-mixed`` -> ``bf16_mixed``: both spellings name one recipe."""
    return name.replace("-", "_")


_TABLE_RECORDS: dict[int, str] = {}
"""``id`` of each record :data:`MIXED_PRECISION_RECIPES` holds -> its name. Those objects are shared
by every lookup, so they refuse edits; a copy of one is an ordinary object."""


@dataclass(kw_only=True)
class MixedPrecisionConfig(StrictFields):
    """A precision recipe: what one precision setting means for the model, optimizer and DDP configs
    it drives. Set ``cfg.mixed_precision`` to one, or edit the fields of the one :meth:`from_name`
    gives; the recipe table holds one per name. It owns the same flags a recipe name does."""

    bf16: bool = False
    fp16: bool = False
    params_dtype: torch.dtype | None = None
    """``None``: ``torch.bfloat16`` with ``bf16``, ``torch.half`` with ``fp16``, else ``torch.float32``."""
    grad_reduce_in_fp32: bool = True
    fp8: str | None = None
    """FP8 compute format (``hybrid``, ``e4m3``); needs Transformer Engine."""
    fp8_recipe: str | None = None
    first_last_layers_bf16: bool = False
    """Keep the first/last transformer layers out of FP8/FP4 (counts below)."""
    num_layers_at_start_in_bf16: int = 0
    num_layers_at_end_in_bf16: int = 0
    fp8_margin: int = 0
    fp8_amax_history_len: int = 1
    """Delayed scaling only: how many steps of amax history the scale is taken from."""
    fp8_amax_compute_algo: str = "most_recent"
    fp4: str | None = None
    """FP4 compute format (``e2m1``); needs Transformer Engine on a Blackwell GPU."""
    fp4_recipe: str = "nvfp4"
    pipeline_dtype: torch.dtype | None = None
    """dtype of the activations sent between pipeline stages (``model.pipeline_dtype``); every recipe
    of the table sets it; ``None`` (a hand-made object's default): ``params_dtype``."""
    autocast_enabled: bool = False
    """Megatron-Bridge's autocast switch, accepted at ``False`` only (rule ``autocast-not-offered``):
    the forward step is not wrapped in ``torch.autocast``; weights and compute use ``params_dtype``."""
    autocast_dtype: torch.dtype | None = None
    """The autocast's dtype, accepted at ``None`` only (rule ``autocast-not-offered``)."""
    fp8_param: bool = False
    """FP8 primary weights, accepted at ``False`` only (rule ``fp8-param-not-offered``): parameters stay
    in ``params_dtype`` and FP8 is used for compute."""
    fp8_param_gather: bool = False
    """Gathering FP8 parameters (Megatron-Bridge keeps it equal to ``fp8_param``), accepted at
    ``False`` only (rule ``fp8-param-not-offered``)."""

    def __setattr__(self, name: str, value: Any) -> None:
        table_name = _TABLE_RECORDS.get(id(self))
        if table_name is not None:
            raise dataclasses.FrozenInstanceError(
                f"cannot assign to field {name!r}: MIXED_PRECISION_RECIPES[{table_name!r}] is the table's "
                f"shared record; edit a copy, get_mixed_precision_config({table_name!r})"
            )
        super().__setattr__(name, value)

    @property
    def needs_transformer_engine(self) -> bool:
        """FP8 and FP4 compute exist only in Transformer Engine."""
        return self.fp8 is not None or self.fp4 is not None

    @classmethod
    def from_name(cls, name: str) -> MixedPrecisionConfig:
        """A new object form of the named recipe (``UnknownMixedPrecisionError``, a ``ValueError``
        and a ``KeyError``, for an unknown name)."""
        record = MIXED_PRECISION_RECIPES.get(canonical_name(name))
        if record is None:
            raise UnknownMixedPrecisionError(name)
        return cls(**{field.name: getattr(record, field.name) for field in dataclasses.fields(record)})

    def as_recipe(self) -> MixedPrecisionConfig:
        """What this object means for the configs it drives: a copy with ``params_dtype`` and
        ``pipeline_dtype`` decided where they are ``None``."""
        params_dtype = self.params_dtype
        if params_dtype is None:
            params_dtype = torch.bfloat16 if self.bf16 else torch.half if self.fp16 else torch.float32
        pipeline_dtype = params_dtype if self.pipeline_dtype is None else self.pipeline_dtype
        return dataclasses.replace(self, params_dtype=params_dtype, pipeline_dtype=pipeline_dtype)


MixedPrecisionRecipe = MixedPrecisionConfig
"""The name the recipe table's records had while they were a class of their own (the same fields
less the four accepted at their defaults only); one class now."""

MixedPrecisionSetting = str | MixedPrecisionConfig | None
"""What ``cfg.mixed_precision`` holds: a recipe name, an object, or ``None`` (no recipe)."""


# The recipes' field groups (keyword arguments of MixedPrecisionConfig, of several types).
_BF16: dict[str, Any] = dict(
    bf16=True, fp16=False, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, grad_reduce_in_fp32=True
)
_FP16: dict[str, Any] = dict(
    bf16=False, fp16=True, params_dtype=torch.half, pipeline_dtype=torch.half, grad_reduce_in_fp32=False
)
_FP32: dict[str, Any] = dict(
    bf16=False, fp16=False, params_dtype=torch.float32, pipeline_dtype=torch.float32, grad_reduce_in_fp32=False
)
_DELAYED: dict[str, Any] = dict(
    fp8="hybrid", fp8_recipe="delayed", fp8_amax_history_len=1024, fp8_amax_compute_algo="max"
)
_MXFP8: dict[str, Any] = dict(fp8="e4m3", fp8_recipe="mxfp8")
_CURRENT: dict[str, Any] = dict(
    fp8="hybrid",
    fp8_recipe="tensorwise",
    first_last_layers_bf16=True,
    num_layers_at_start_in_bf16=1,
    num_layers_at_end_in_bf16=1,
)
_SUBCHANNEL: dict[str, Any] = dict(fp8="hybrid", fp8_recipe="blockwise")
_NVFP4: dict[str, Any] = dict(fp4="e2m1", fp4_recipe="nvfp4")
_EDGE_2: dict[str, Any] = dict(first_last_layers_bf16=True, num_layers_at_start_in_bf16=2, num_layers_at_end_in_bf16=2)


class RecipeTable(dict[str, MixedPrecisionConfig]):
    """The recipe table: a ``dict`` keyed by the underscore names whose lookups (``in``, ``[]``,
    ``get``) also take the hyphenated spelling (``"bf16-mixed" in MIXED_PRECISION_RECIPES``), so the
    table answers for every name :func:`get_mixed_precision_config` accepts. Iteration lists each
    recipe once, by its underscore name."""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(canonical_name(name))

    def __getitem__(self, name: str) -> MixedPrecisionConfig:
        return super().__getitem__(canonical_name(name) if isinstance(name, str) else name)

    def get(self, name: str, default: Any = None) -> Any:
        """The recipe called ``name`` (either spelling), else ``default``."""
        return self[name] if name in self else default


MIXED_PRECISION_RECIPES: RecipeTable = RecipeTable(
    {
        "bf16_mixed": MixedPrecisionConfig(**_BF16),
        "fp16_mixed": MixedPrecisionConfig(**_FP16),
        "fp32": MixedPrecisionConfig(**_FP32),
        "bf16_with_fp8_delayed_scaling_mixed": MixedPrecisionConfig(**_BF16, **_DELAYED),
        "fp16_with_fp8_delayed_scaling_mixed": MixedPrecisionConfig(**_FP16, **_DELAYED),
        "bf16_with_fp8_current_scaling_mixed": MixedPrecisionConfig(**_BF16, **_CURRENT),
        "fp16_with_fp8_current_scaling_mixed": MixedPrecisionConfig(**_FP16, **_CURRENT),
        "nemotron_h_bf16_with_fp8_current_scaling_mixed": MixedPrecisionConfig(**_BF16, **{**_CURRENT, **_EDGE_2}),
        "nanov2_bf16_with_fp8_current_scaling_mixed": MixedPrecisionConfig(
            **_BF16, **{**_CURRENT, **_EDGE_2, "fp8_recipe": "blockwise"}
        ),
        "bf16_with_mxfp8_mixed": MixedPrecisionConfig(**_BF16, **_MXFP8),
        "fp16_with_mxfp8_mixed": MixedPrecisionConfig(**_FP16, **_MXFP8),
        "bf16_with_fp8_subchannel_scaling_mixed": MixedPrecisionConfig(**_BF16, **_SUBCHANNEL),
        "fp16_with_fp8_subchannel_scaling_mixed": MixedPrecisionConfig(**_FP16, **_SUBCHANNEL),
        "bf16_with_nvfp4_mixed": MixedPrecisionConfig(**_BF16, **_NVFP4),
        "nemotron_3_super_bf16_with_nvfp4_mixed": MixedPrecisionConfig(
            **_BF16, **_NVFP4, first_last_layers_bf16=True, num_layers_at_end_in_bf16=14
        ),
    }
)
"""Every precision recipe by name; the recipe functions below and ``cfg.mixed_precision="<name>"``
read this one table (hyphens may stand for underscores: ``bf16-mixed``). Its records are shared by
every lookup, so they are read-only."""
_TABLE_RECORDS.update({id(record): name for name, record in MIXED_PRECISION_RECIPES.items()})


class UnknownMixedPrecisionError(ConfigError, KeyError):
    """A recipe name that is not in :data:`MIXED_PRECISION_RECIPES`, with the closest names. A
    ``ConfigError`` (so a ``ValueError``, Megatron-Bridge's error for it; its text carries
    Megatron-Bridge's sentence "Unknown mixed-precision recipe") and a ``KeyError`` (a failed table
    lookup)."""

    def __init__(self, name: Any) -> None:
        known = sorted(MIXED_PRECISION_RECIPES)
        close = did_you_mean(canonical_name(name), known) if isinstance(name, str) else None
        fix = close or "use one of the recipes listed, or pass a MixedPrecisionConfig"
        violation = Violation(
            "mixed-precision-known",
            ("mixed_precision",),
            (name,),
            f"Unknown mixed-precision recipe {name!r}. Available recipes: {', '.join(known)}.",
            fix,
        )
        super().__init__([violation], "Unknown mixed-precision recipe")
        self.name = name

    def __str__(self) -> str:
        return str(self.args[0])


def get_mixed_precision_config(name: str | MixedPrecisionConfig) -> MixedPrecisionConfig:
    """A new object form of the recipe called ``name`` (to edit before assigning it); an object
    given is returned as it is. ``ValueError`` for an unknown name."""
    if isinstance(name, MixedPrecisionConfig):
        return name
    return MixedPrecisionConfig.from_name(name)


def is_known_setting(setting: Any) -> bool:
    """``None``, a recipe name this package defines, or a :class:`MixedPrecisionConfig`."""
    if isinstance(setting, str):
        return canonical_name(setting) in MIXED_PRECISION_RECIPES
    return setting is None or isinstance(setting, MixedPrecisionConfig)


# Recipe functions: Megatron-Bridge's names, each a new object of the recipe of the same name.


def bf16_mixed() -> MixedPrecisionConfig:
    """BF16 weights and compute, FP32 gradient reduction."""
    return MixedPrecisionConfig.from_name("bf16_mixed")


def fp16_mixed() -> MixedPrecisionConfig:
    """FP16 weights and compute (loss scaling), FP16 gradient reduction."""
    return MixedPrecisionConfig.from_name("fp16_mixed")


def bf16_with_fp8_delayed_scaling_mixed() -> MixedPrecisionConfig:
    """BF16 with FP8 (hybrid) GEMMs, scales from a 1024-step amax history (Transformer Engine)."""
    return MixedPrecisionConfig.from_name("bf16_with_fp8_delayed_scaling_mixed")


def fp16_with_fp8_delayed_scaling_mixed() -> MixedPrecisionConfig:
    """FP16 with FP8 (hybrid) GEMMs, delayed scaling (Transformer Engine)."""
    return MixedPrecisionConfig.from_name("fp16_with_fp8_delayed_scaling_mixed")


def bf16_with_mxfp8_mixed() -> MixedPrecisionConfig:
    """BF16 with block-scaled MXFP8 GEMMs (Transformer Engine on Blackwell)."""
    return MixedPrecisionConfig.from_name("bf16_with_mxfp8_mixed")


def fp16_with_mxfp8_mixed() -> MixedPrecisionConfig:
    """FP16 with block-scaled MXFP8 GEMMs (Transformer Engine on Blackwell)."""
    return MixedPrecisionConfig.from_name("fp16_with_mxfp8_mixed")


def bf16_with_fp8_current_scaling_mixed() -> MixedPrecisionConfig:
    """BF16 with per-tensor current-scaling FP8; the first and last layer stay BF16."""
    return MixedPrecisionConfig.from_name("bf16_with_fp8_current_scaling_mixed")


def fp16_with_fp8_current_scaling_mixed() -> MixedPrecisionConfig:
    """FP16 with per-tensor current-scaling FP8; the first and last layer stay out of FP8."""
    return MixedPrecisionConfig.from_name("fp16_with_fp8_current_scaling_mixed")


def nemotron_h_bf16_with_fp8_current_scaling_mixed() -> MixedPrecisionConfig:
    """Current-scaling FP8 with two BF16 layers at each end (the Nemotron-H setting)."""
    return MixedPrecisionConfig.from_name("nemotron_h_bf16_with_fp8_current_scaling_mixed")


def nanov2_bf16_with_fp8_current_scaling_mixed() -> MixedPrecisionConfig:
    """Blockwise-scaled FP8 with two BF16 layers at each end (the Nemotron Nano v2 setting)."""
    return MixedPrecisionConfig.from_name("nanov2_bf16_with_fp8_current_scaling_mixed")


def bf16_with_fp8_subchannel_scaling_mixed() -> MixedPrecisionConfig:
    """BF16 with blockwise (sub-channel) scaled FP8 GEMMs (Transformer Engine on Hopper)."""
    return MixedPrecisionConfig.from_name("bf16_with_fp8_subchannel_scaling_mixed")


def fp16_with_fp8_subchannel_scaling_mixed() -> MixedPrecisionConfig:
    """FP16 with blockwise (sub-channel) scaled FP8 GEMMs (Transformer Engine on Hopper)."""
    return MixedPrecisionConfig.from_name("fp16_with_fp8_subchannel_scaling_mixed")


def bf16_with_nvfp4_mixed() -> MixedPrecisionConfig:
    """BF16 with NVFP4 (E2M1) GEMMs (Transformer Engine on Blackwell)."""
    return MixedPrecisionConfig.from_name("bf16_with_nvfp4_mixed")


def nemotron_3_super_bf16_with_nvfp4_mixed() -> MixedPrecisionConfig:
    """NVFP4 with the last 14 layers in BF16 (the Nemotron 3 Super setting)."""
    return MixedPrecisionConfig.from_name("nemotron_3_super_bf16_with_nvfp4_mixed")
