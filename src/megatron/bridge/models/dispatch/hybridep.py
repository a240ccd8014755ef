"""HybridEP (``moe_flex_dispatcher_backend=hybridep``): megatron-core's flex dispatcher over the
``deep_ep`` package's hybrid kernels (its hybrid-ep branch), which also run across the NVLink domain
of GB200/GB300 NVL72 systems. Its own setting is the per-rank token budget
(``model.moe_expert_rank_capacity_factor``), which sizes its receive buffers."""

from __future__ import annotations

from typing import Any

from megatron.bridge.models.dispatch.deepep import DEEP_EP
from megatron.bridge.models.dispatch.dispatch_path import BackendSupport, DispatchPath, RunFacts
from megatron.bridge.models.dispatch.flex_common import (
    CAPACITY_FIELD,
    OP_FUSER_FIX,
    capacity_text,
    describe_flex,
    flex_backend,
)
from megatron.bridge.utils.rule_records import TE_VERSION_VALUE, Rule


def _rules(facts: RunFacts) -> tuple[Rule, ...]:
    return (
        Rule(
            id="rank-capacity-factor-hybridep-needs-op-fuser",
            group="flex-settings",
            fields=(CAPACITY_FIELD, "model.use_transformer_engine_op_fuser", "model.layer_spec"),
            applies=lambda cfg, ctx: (
                cfg.model.moe_expert_rank_capacity_factor is not None and flex_backend(cfg) == "hybridep"
            ),
            holds=lambda cfg, ctx: bool(cfg.model.use_transformer_engine_op_fuser) and facts.layers_use_te(cfg, ctx),
            message="HybridEP with a per-rank budget hands the experts a fixed-size, padded buffer: megatron-core "
            "requires Transformer Engine's fused grouped MLP (the op fuser) to consume it, which the "
            "torch-native and local experts do not have; tokens over the budget are dropped",
            fix=f"use {OP_FUSER_FIX}, or set model.moe_expert_rank_capacity_factor=null (dropless, sized per step)",
            extra_values=TE_VERSION_VALUE,
        ),
    )


def _describe(model: Any) -> str:
    return describe_flex(model, [capacity_text(model)])


PATH = DispatchPath(
    name="hybridep",
    kind="flex",
    summary="HybridEP's kernels (the deep_ep package, hybrid-ep branch) inside megatron-core's flex dispatcher",
    token_dispatcher_type="flex",
    fields=(CAPACITY_FIELD,),
    packages=(DEEP_EP,),
    gpus=BackendSupport(
        "hybridep",
        "HybridEP",
        (8, 9, 10),
        nvl72=True,
        applicable="HybridEP is only applicable for GB200, GB300 with NVL72 and for Ampere, Hopper, B200 and B300 GPUs",
        supported="HybridEP is supported for GB200, GB300 with NVL72 and for Ampere, Hopper, B200 and B300 GPUs",
    ),
    rules=_rules,
    describe=_describe,
)
