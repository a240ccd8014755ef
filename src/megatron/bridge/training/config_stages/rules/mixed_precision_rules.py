"""Rules of the precision recipes, as data: FP4 (read from the precision recipe, or with
``mixed_precision=null`` from ``model.fp4``), and the ``MixedPrecisionConfig`` fields of
Megatron-Bridge that are accepted at their defaults only.

NVFP4 compute exists only in Transformer Engine's NVFP4 kernels, which run on Blackwell tensor
cores. Without them the torch layers would compute in BF16 and the recipe would have no effect,
so a run that asks for FP4 where it cannot happen is refused when it is validated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from megatron.bridge.training.config_stages.facts.gpu_catalog import capability_at_least
from megatron.bridge.training.config_stages.facts.overlap_facts import precision_fp4, resolved_layer_spec
from megatron.bridge.training.config_stages.schema.mixed_precision_config import MixedPrecisionConfig
from megatron.bridge.training.config_stages.schema.rule_base import TE_VERSION_VALUE, Rule, RuleContext

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

FP4_MIN_CAPABILITY = (10, 0)
"""NVFP4 GEMMs run on Blackwell (compute capability 10.0+)."""


def _precision_object(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    """``mixed_precision`` is a ``MixedPrecisionConfig`` (a recipe name has these fields at their defaults)."""
    return isinstance(cfg.mixed_precision, MixedPrecisionConfig)


def _no_autocast(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    mp = cfg.mixed_precision
    return not isinstance(mp, MixedPrecisionConfig) or (mp.autocast_enabled is False and mp.autocast_dtype is None)


def _no_fp8_params(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    mp = cfg.mixed_precision
    return not isinstance(mp, MixedPrecisionConfig) or (mp.fp8_param is False and mp.fp8_param_gather is False)


def _uses_fp4(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return precision_fp4(cfg) is not None


PRECISION_RULES: tuple[Rule, ...] = (
    Rule(
        id="fp4-needs-transformer-engine",
        fields=("mixed_precision", "model.fp4"),
        applies=_uses_fp4,
        holds=lambda cfg, ctx: ctx.te_version is not None,
        message="FP4 (NVFP4) compute needs Transformer Engine, which does not import here",
        fix="use mixed_precision=bf16_mixed (-c bf16), or install the 'te' extra on a Blackwell GPU machine",
        extra_values=TE_VERSION_VALUE,
    ),
    Rule(
        id="fp4-needs-te-layers",
        fields=("mixed_precision", "model.fp4", "model.layer_spec"),
        applies=lambda cfg, ctx: (
            _uses_fp4(cfg, ctx) and (ctx.te_version is not None or cfg.model.layer_spec in ("local", "torch_native"))
        ),
        holds=lambda cfg, ctx: resolved_layer_spec(cfg, ctx) == "transformer_engine",
        message="FP4 compute happens inside Transformer Engine's layers; megatron-core's local and the "
        "torch-native layers would compute in bf16 and the FP4 setting would have no effect",
        fix="set model.layer_spec=auto or transformer_engine (auto picks TE for FP4), or use "
        "mixed_precision=bf16_mixed (-c bf16)",
    ),
    Rule(
        id="fp4-needs-blackwell",
        fields=("mixed_precision", "model.fp4"),
        applies=lambda cfg, ctx: _uses_fp4(cfg, ctx) and ctx.device_capability is not None,
        holds=lambda cfg, ctx: capability_at_least(ctx.device_capability, FP4_MIN_CAPABILITY),
        message="FP4 (NVFP4) needs Blackwell tensor cores (compute capability 10.0+)",
        fix="use mixed_precision=bf16_with_fp8_current_scaling_mixed (-c fp8_cs) on Hopper, or validate "
        "for a Blackwell GPU (-g b200)",
        derived_values=(("target_gpu_capability", lambda cfg, ctx: ctx.device_capability),),
    ),
    Rule(
        id="autocast-not-offered",
        fields=("mixed_precision.autocast_enabled", "mixed_precision.autocast_dtype"),
        applies=_precision_object,
        holds=_no_autocast,
        message="the forward step is not run under torch.autocast here: weights and compute use the "
        "recipe's params_dtype (Megatron-Bridge sets autocast_enabled on no megatron-core config either, "
        "so it has no effect there)",
        fix="leave autocast_enabled=False and autocast_dtype=None, and choose the compute dtype with the "
        "recipe (bf16_mixed, fp16_mixed)",
    ),
    Rule(
        id="fp8-param-not-offered",
        fields=("mixed_precision.fp8_param", "mixed_precision.fp8_param_gather"),
        applies=_precision_object,
        holds=_no_fp8_params,
        message="FP8 primary weights (and gathering them in FP8) are not offered: parameters stay in "
        "params_dtype and FP8 is used for compute only",
        fix="leave fp8_param=False and fp8_param_gather=False; the FP8 recipes still compute in FP8",
    ),
)
"""Part of the general rule table: FP4 where it cannot run, and precision fields that would have no
effect, are refused, not ignored."""
