"""What the overlap rules read besides the switches: layer implementation, graph scopes, precision.

Rules run on the resolved copy, where every switch holds its effective value on its owner
(``comm_overlap.<switch>``); they read the owner, never the megatron-facing copies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from packaging.version import Version

from megatron.bridge.models.layer_specs import LayerSpecChoice, choose_layer_spec, te_only_features
from megatron.bridge.training.config_stages.facts.megatron_compat import graph_modules
from megatron.bridge.training.config_stages.facts.mixed_precision_targets import mixed_precision_recipe
from megatron.bridge.training.config_stages.schema.rule_base import RuleContext

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer


def torch_text(ctx: RuleContext) -> str:
    """The torch version as rules show it."""
    return "unknown" if ctx.torch_version is None else str(ctx.torch_version)


def te_at_least(ctx: RuleContext, version: str) -> bool:
    """Transformer Engine is installed and at least ``version``."""
    return ctx.te_version is not None and ctx.te_version >= Version(version)


def layer_spec_choice(cfg: ConfigContainer, ctx: RuleContext) -> LayerSpecChoice:
    """The layer implementation the run builds on the machine ``ctx`` describes, and why."""
    return choose_layer_spec(
        cfg.model.layer_spec,
        device=cfg.dist.device,
        te_available=ctx.te_version is not None,
        te_features=te_only_features(
            cfg.model, bool(cfg.comm_overlap.tp_comm_overlap), fp8=precision_fp8(cfg), fp4=precision_fp4(cfg)
        ),
    )


def precision_fp8(cfg: ConfigContainer) -> str | None:
    """The FP8 format the run computes with: its precision recipe's, or with ``mixed_precision=null``
    the model's own ``fp8`` (``None``: no FP8; an unknown recipe name counts as none, its own rule
    reports it)."""
    if cfg.mixed_precision is None:
        return cfg.model.fp8
    recipe = mixed_precision_recipe(cfg.mixed_precision)
    return None if recipe is None else recipe.fp8


def precision_fp4(cfg: ConfigContainer) -> str | None:
    """The FP4 format the run computes with, read as :func:`precision_fp8` reads FP8."""
    if cfg.mixed_precision is None:
        return getattr(cfg.model, "fp4", None)
    recipe = mixed_precision_recipe(cfg.mixed_precision)
    return None if recipe is None else getattr(recipe, "fp4", None)


def resolved_layer_spec(cfg: ConfigContainer, ctx: RuleContext) -> str:
    """The name of :func:`layer_spec_choice`."""
    return layer_spec_choice(cfg, ctx).name


def layers_use_te(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    """Whether the built layers will be Transformer Engine modules on the machine ``ctx`` describes."""
    return resolved_layer_spec(cfg, ctx) == "transformer_engine"


def experts_defer_wgrad(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    """Whether the expert layers implement a real ``backward_dw`` (TE or torch-native grouped GEMM)."""
    return resolved_layer_spec(cfg, ctx) in ("transformer_engine", "torch_native")


def per_layer_graphs(cfg: ConfigContainer) -> bool:
    """CUDA graphs captured per layer (``local`` or ``transformer_engine``)."""
    return cfg.model.cuda_graph_impl in ("local", "transformer_engine")


def has_shared_expert(cfg: ConfigContainer) -> bool:
    """The MoE layers have a shared expert."""
    return cfg.model.moe_shared_expert_intermediate_size is not None


def wgrad_in_graph_scope(cfg: ConfigContainer) -> bool:
    """Delayed wgrad inside a captured region: attention (or the whole layer), or ``moe_router``
    when it captures a shared expert that is not overlapped."""
    if not per_layer_graphs(cfg):
        return False
    scopes = graph_modules(cfg.model)
    router_with_shared = "moe_router" in scopes and has_shared_expert(cfg) and not cfg.model.moe_shared_expert_overlap
    return not scopes or "attn" in scopes or router_with_shared


def ep_on(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    """EP overlap is on (effective value of the owner)."""
    return bool(cfg.comm_overlap.overlap_moe_expert_parallel_comm)


def dw_on(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    """Delayed wgrad is on (effective value of the owner)."""
    return bool(cfg.comm_overlap.delay_wgrad_compute)


def dw_te(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    """Delayed wgrad with Transformer Engine installed (its version rules apply)."""
    return dw_on(cfg, ctx) and ctx.te_version is not None


def dw_graph(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    """Delayed wgrad with TE, inside a CUDA-graph scope."""
    return dw_te(cfg, ctx) and wgrad_in_graph_scope(cfg)


def half_precision(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    """The model computes in bf16 or fp16: from the precision recipe, or with ``mixed_precision=null``
    from the model's own flags. An unknown recipe name passes here (its own rule reports it)."""
    if cfg.mixed_precision is None:
        return bool(cfg.model.bf16 or cfg.model.fp16)
    recipe = mixed_precision_recipe(cfg.mixed_precision)
    return recipe is None or recipe.bf16 or recipe.fp16
