"""NCCL EP (``moe_flex_dispatcher_backend=ncclep``): megatron-core's flex dispatcher over NCCL's
expert-parallel exchange, called through Transformer Engine (``transformer_engine.pytorch.ep``, in a
TE built with ``NVTE_BUILD_WITH_NCCL_EP=1``). Its own settings: the per-rank token budget
(``model.moe_expert_rank_capacity_factor``, which megatron-core 0.19.2 requires), the static shape
(``model.moe_ncclep_static_shape``: fixed-size buffers the experts read on the GPU) and zero copy
(``model.moe_ncclep_zero_copy``)."""

from __future__ import annotations

from typing import Any

from megatron.bridge.models.dispatch.dispatch_path import (
    PLAIN_ALLTOALL_TEXT,
    BackendSupport,
    DispatchPath,
    PackageNeed,
    RunFacts,
)
from megatron.bridge.models.dispatch.flex_common import (
    CAPACITY_FIELD,
    OP_FUSER_FIX,
    capacity_text,
    describe_flex,
    on_backends,
)
from megatron.bridge.utils.rule_records import Rule, RuleContext

_TE_EP_INSTALL = "install a Transformer Engine built with NCCL EP (NVTE_BUILD_WITH_NCCL_EP=1) on the GPU machines"
TE_NCCL_EP = PackageNeed(
    module="transformer_engine.pytorch.ep",
    rule_id="ncclep-needs-te-nccl-ep",
    message="the NCCL EP backend is NCCL's expert-parallel exchange called through Transformer Engine "
    "(transformer_engine.pytorch.ep), which does not import here; megatron-core would fail when it "
    "builds the MoE layers",
    fix=f"{_TE_EP_INSTALL}, or choose deepep/hybridep, or {PLAIN_ALLTOALL_TEXT}",
    note_id="ncclep-te-nccl-ep-not-checked-on-cpu-host",
    note_message="note: Transformer Engine's NCCL EP module does not import on this CPU host; the GPU "
    "machines must have it",
    note_fix=f"{_TE_EP_INSTALL} where the job runs",
)
"""Transformer Engine's NCCL EP module."""
_NCCLEP = on_backends(("ncclep",))


def _capability_major(facts: RunFacts, ctx: RuleContext) -> int | None:
    target = facts.target_gpu(ctx)
    return target.capability[0] if target.known and target.capability else None


def _rules(facts: RunFacts) -> tuple[Rule, ...]:
    return (
        Rule(
            id="ncclep-needs-rank-capacity-factor",
            group="flex-settings",
            fields=("model.moe_flex_dispatcher_backend", CAPACITY_FIELD),
            applies=_NCCLEP,
            holds=lambda cfg, ctx: cfg.model.moe_expert_rank_capacity_factor is not None,
            message="megatron-core 0.19.2's NCCL EP dispatcher sizes its per-rank receive buffer from "
            "moe_expert_rank_capacity_factor and refuses to build without it; a routing over the budget stops "
            "the job (no tokens are dropped)",
            fix="set model.moe_expert_rank_capacity_factor generously (e.g. 1.5)",
        ),
        Rule(
            id="ncclep-settings-need-ncclep",
            group="flex-settings",
            fields=("model.moe_ncclep_static_shape", "model.moe_ncclep_zero_copy", "model.moe_flex_dispatcher_backend"),
            applies=lambda cfg, ctx: bool(cfg.model.moe_ncclep_static_shape or cfg.model.moe_ncclep_zero_copy),
            holds=_NCCLEP,
            message="moe_ncclep_static_shape and moe_ncclep_zero_copy are read only by the NCCL EP dispatcher; "
            "with another dispatcher they would do nothing",
            fix="set model.moe_ncclep_static_shape=false and model.moe_ncclep_zero_copy=false, or select ncclep",
        ),
        Rule(
            id="ncclep-zero-copy-needs-static-shape",
            group="flex-settings",
            fields=("model.moe_ncclep_zero_copy", "model.moe_ncclep_static_shape"),
            applies=lambda cfg, ctx: _NCCLEP(cfg, ctx) and bool(cfg.model.moe_ncclep_zero_copy),
            holds=lambda cfg, ctx: bool(cfg.model.moe_ncclep_static_shape),
            message="NCCL EP's zero-copy path writes into fixed-size symmetric-memory buffers, so it needs the "
            "static shape (megatron-core refuses it otherwise)",
            fix="set model.moe_ncclep_static_shape=true as well, or model.moe_ncclep_zero_copy=false",
        ),
        Rule(
            id="ncclep-static-shape-needs-fused-grouped-experts",
            group="flex-settings",
            fields=(
                "model.moe_ncclep_static_shape",
                "model.use_transformer_engine_op_fuser",
                "model.moe_grouped_gemm",
                "model.layer_spec",
            ),
            applies=lambda cfg, ctx: _NCCLEP(cfg, ctx) and bool(cfg.model.moe_ncclep_static_shape),
            holds=lambda cfg, ctx: (
                bool(cfg.model.use_transformer_engine_op_fuser and cfg.model.moe_grouped_gemm)
                and facts.layers_use_te(cfg, ctx)
            ),
            message="with the static shape the experts get the whole fixed-size receive buffer and must read "
            "the per-expert counts on the GPU: only Transformer Engine's fused grouped MLP (the op fuser over "
            "grouped experts) does; megatron-core refuses the static shape without it",
            fix=f"use {OP_FUSER_FIX}, or set model.moe_ncclep_static_shape=false (eager: sized per step)",
        ),
        Rule(
            id="ncclep-static-shape-low-precision-needs-blackwell",
            group="flex-settings",
            fields=("model.moe_ncclep_static_shape", "mixed_precision"),
            applies=lambda cfg, ctx: (
                _NCCLEP(cfg, ctx)
                and bool(cfg.model.moe_ncclep_static_shape)
                and facts.low_precision(cfg)
                and _capability_major(facts, ctx) is not None
            ),
            holds=lambda cfg, ctx: (_capability_major(facts, ctx) or 0) >= 10,
            message="NCCL EP's static shape with FP8/FP4 runs the experts through the CuTe DSL grouped GEMM, "
            "which needs a Blackwell GPU (sm100 or later) and NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 in the job's "
            "environment; megatron-core refuses it on older GPUs",
            fix="set model.moe_ncclep_static_shape=false on Hopper, or train on B200/B300/GB200/GB300",
            extra_values=(("target_gpu", lambda ctx: facts.target_gpu(ctx).describe()),),
        ),
        Rule(
            id="ncclep-ep-overlap-syncs-without-static-shape",
            group="flex-settings",
            severity="warning",
            fields=("comm_overlap.overlap_moe_expert_parallel_comm", "model.moe_ncclep_static_shape"),
            applies=lambda cfg, ctx: _NCCLEP(cfg, ctx) and bool(cfg.comm_overlap.overlap_moe_expert_parallel_comm),
            holds=lambda cfg, ctx: bool(cfg.model.moe_ncclep_static_shape),
            message="with NCCL EP sized per step (moe_ncclep_static_shape=false) each dispatch waits on the host "
            "for the received token count, which serialises the EP-overlap schedule: it trains correctly but "
            "overlaps little (megatron-core warns the same)",
            fix="set model.moe_ncclep_static_shape=true (Transformer Engine's fused grouped MLP; FP8/FP4 on "
            "Blackwell), or compare step times with EP overlap off",
        ),
    )


def _describe(model: Any) -> str:
    shape = "static shape" if model.moe_ncclep_static_shape else "sized per step (host sync)"
    return describe_flex(
        model, [shape, f"zero copy {'on' if model.moe_ncclep_zero_copy else 'off'}", capacity_text(model)]
    )


PATH = DispatchPath(
    name="ncclep",
    kind="flex",
    summary="NCCL's expert-parallel exchange through Transformer Engine inside megatron-core's flex dispatcher",
    token_dispatcher_type="flex",
    fields=(CAPACITY_FIELD, "model.moe_ncclep_static_shape", "model.moe_ncclep_zero_copy"),
    packages=(TE_NCCL_EP,),
    gpus=BackendSupport(
        "ncclep",
        "NCCL EP",
        (9, 10),
        nvl72=True,
        applicable="NCCL EP is only applicable to Hopper and Blackwell GPUs",
        supported="NCCL EP is supported for Hopper and Blackwell GPUs",
    ),
    rules=_rules,
    describe=_describe,
)
