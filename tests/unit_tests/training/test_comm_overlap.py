"""CommOverlapConfig: rules table (every rule positive and negative), resolution, ownership, docs."""

from __future__ import annotations

import ast
import copy
import inspect
import runpy
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from overlap_helpers import (
    WORLD,
    ctx,
    ep_overlap_cfg,
    finalize,
    set_fields,
    violated_ids,
)

from megatron.bridge.recipes.qwen import (
    qwen3_30b_a3b_pretrain_8gpu_config,
    qwen3_30b_a3b_pretrain_config,
)
from megatron.bridge.training import comm_overlap, flex_dispatcher_backend
from megatron.bridge.training.comm_overlap import (
    BOOL_SWITCHES,
    DEFAULT_BUCKET_SIZE,
    OVERLAP_FIELDS,
    OVERLAP_RULES,
    CommOverlapConfig,
    format_effective_values,
)
from megatron.bridge.training.config_stages.facts import gpu_catalog, ownership
from megatron.bridge.training.config_stages.facts import overlap_facts as facts
from megatron.bridge.training.config_stages.facts import overlap_fields as fields
from megatron.bridge.training.config_stages.facts.megatron_compat import graph_modules
from megatron.bridge.training.config_stages.resolution import finalize as finalize_module
from megatron.bridge.training.config_stages.resolution import overlap_docs, overlap_report
from megatron.bridge.training.config_stages.resolution import overlap_resolution as resolution
from megatron.bridge.training.config_stages.resolution.finalize import resolve_config
from megatron.bridge.training.config_stages.resolution.overlap_docs import render_docs
from megatron.bridge.training.config_stages.rules import overlap_rules as rules
from megatron.bridge.training.config_stages.schema.rule_base import read_field
from megatron.bridge.training.errors import CommOverlapConfigError, ConfigValidationError, OverrideError
from megatron.bridge.training.utils.omegaconf_utils import apply_overrides

REPO = Path(__file__).resolve().parents[3]


def effective_overlap_values(cfg, context=None):
    """Each switch's effective value and source, from one resolution of ``cfg``."""
    return resolve_config(cfg, ctx=context or ctx()).values


# --------------------------------------------------------------------------------------------
# The rules table: one violating and one satisfying configuration per rule
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """``violate`` breaks ``rule``; ``satisfy`` is a nearby config where the rule applies and holds
    (or, for applies-guards, does not apply)."""

    rule: str
    violate: dict[str, Any]
    satisfy: dict[str, Any]
    ctx_violate: dict[str, Any] = field(default_factory=dict)
    ctx_satisfy: dict[str, Any] = field(default_factory=dict)
    name: str = ""


OFF = {"comm_overlap.overlap_moe_expert_parallel_comm": False}
DW = {"comm_overlap.delay_wgrad_compute": True}
TE_GRAPH = {"model.cuda_graph_impl": "transformer_engine"}
TP_OVERLAP = {
    "comm_overlap.tp_comm_overlap": True,
    "model.tensor_model_parallel_size": 2,
    "model.sequence_parallel": True,
}
FLEX = {"model.moe_token_dispatcher_type": "flex", "model.moe_flex_dispatcher_backend": "deepep"}
H100 = {"device_capability": (9, 0), "device_name": "h100"}
TE_NCCL_EP = "transformer_engine.pytorch.ep"
"""The module the NCCL EP backend needs (``RuleContext.packages``)."""
GB200 = {"device_capability": (10, 0), "device_name": "gb200"}
A100 = {"device_capability": (8, 0), "device_name": "a100"}
TE = {"te_version": "2.12"}
HYBRIDEP = {**FLEX, "model.moe_flex_dispatcher_backend": "hybridep"}
NCCLEP = {**FLEX, "model.moe_flex_dispatcher_backend": "ncclep", "model.moe_expert_rank_capacity_factor": 1.5}
TE_FUSED_EXPERTS = {
    "model.layer_spec": "transformer_engine",
    "model.use_transformer_engine_op_fuser": True,
    "model.moe_grouped_gemm": True,
}
STATIC = {**NCCLEP, **TE_FUSED_EXPERTS, "model.moe_ncclep_static_shape": True}
OFFLOAD = {"model.fine_grained_activation_offloading": True}
EARLY = {"model.ep_overlap_early_attn_memory_release": True}

CASES: list[Case] = [
    Case("ep-overlap-needs-expert-parallel", {"model.expert_model_parallel_size": 1}, {}),
    Case("ep-overlap-needs-moe-experts", {"model.num_moe_experts": 1}, {"model.num_moe_experts": 2}),
    Case(
        "ep-overlap-needs-alltoall-or-flex",
        {"model.moe_token_dispatcher_type": "allgather"},
        {"model.moe_token_dispatcher_type": "alltoall"},
    ),
    Case(
        "ep-overlap-needs-alltoall-or-flex",
        {"model.moe_token_dispatcher_type": "allgather"},
        {**FLEX, "model.moe_flex_dispatcher_backend": "hybridep"},
        name="flex-ok",
    ),
    Case("ep-overlap-needs-bf16-or-fp16", {"mixed_precision": "fp32"}, {"mixed_precision": "fp16_mixed"}),
    Case(
        "ep-overlap-pp-needs-vpp",
        {"model.pipeline_model_parallel_size": 2},
        {"model.pipeline_model_parallel_size": 2, "model.virtual_pipeline_model_parallel_size": 2},
    ),
    Case(
        "ep-overlap-no-full-recompute",
        {"model.recompute_granularity": "full"},
        {"model.recompute_granularity": "selective"},
    ),
    Case("ep-overlap-no-recompute-method", {"model.recompute_method": "uniform"}, {"model.recompute_method": None}),
    Case("ep-overlap-no-recompute-num-layers", {"model.recompute_num_layers": 1}, {"model.recompute_num_layers": None}),
    Case("ep-overlap-no-moe-recompute", {"model.recompute_modules": ["moe"]}, {"model.recompute_modules": ["moe_act"]}),
    Case(
        "ep-overlap-no-shared-expert-overlap",
        {"model.moe_shared_expert_overlap": True},
        {"model.moe_shared_expert_overlap": False},
    ),
    Case("ep-overlap-max-one-mtp-layer", {"model.mtp_num_layers": 2}, {"model.mtp_num_layers": 1}),
    Case("ep-overlap-needs-torch-2.6", {}, {}, {"torch_version": "2.5.1"}, {"torch_version": "2.6.0"}),
    Case(
        "ep-overlap-te-cuda-graph-scope",
        {**TE_GRAPH, "model.cuda_graph_modules": ["moe"]},
        {**TE_GRAPH, "model.cuda_graph_modules": ["attn", "moe_router"]},
        {"te_version": "2.12"},
        {"te_version": "2.12"},
    ),
    Case(
        "ep-overlap-te-cuda-graph-scope",
        {**TE_GRAPH, "model.cuda_graph_scope": "mlp"},
        {**TE_GRAPH, "model.cuda_graph_scope": "attn"},
        {"te_version": "2.12"},
        {"te_version": "2.12"},
        name="deprecated-scope-field",
    ),
    Case(
        "ep-overlap-excludes-dispatch-wgrad-overlap",
        {"model.overlap_dispatch_backward_with_experts_wgrad": True},
        {"model.overlap_dispatch_backward_with_experts_wgrad": False},
    ),
    Case("ep-overlap-needs-two-micro-batches", {"train.global_batch_size": 2}, {"train.global_batch_size": 4}),
    Case("delay-wgrad-needs-ep-overlap", {**DW, **OFF}, DW),
    Case(
        "delay-wgrad-no-op-with-local-layers",
        {**DW, "model.layer_spec": "local"},
        DW,
        {},
        {},
        name="auto-is-torch-native-without-te",
    ),
    Case(
        "delay-wgrad-no-op-with-local-layers",
        {**DW, "model.layer_spec": "local"},
        {**DW, "model.layer_spec": "transformer_engine"},
        {"te_version": "2.12"},
        {"te_version": "2.12"},
        name="local-spec-with-te",
    ),
    Case(
        "delay-wgrad-te-2.7",
        {**DW, "model.gradient_accumulation_fusion": True},
        {**DW, "model.gradient_accumulation_fusion": True},
        {"te_version": "2.6"},
        {"te_version": "2.7"},
    ),
    Case(
        "delay-wgrad-te-2.7",
        {**DW, "comm_overlap.overlap_grad_reduce": True},
        {**DW, "comm_overlap.overlap_grad_reduce": False},
        {"te_version": "2.6"},
        {"te_version": "2.6"},
        name="grad-reduce",
    ),
    Case(
        "delay-wgrad-te-cuda-graph-te-2.10",
        {**DW, **TE_GRAPH, "model.cuda_graph_modules": ["moe_router"]},
        {**DW, **TE_GRAPH, "model.cuda_graph_modules": ["moe_router"]},
        {"te_version": "2.9"},
        {"te_version": "2.10"},
    ),
    Case(
        "delay-wgrad-graph-scope-te-2.12",
        {**DW, **TE_GRAPH, "model.cuda_graph_modules": ["attn"], "model.gradient_accumulation_fusion": True},
        {**DW, **TE_GRAPH, "model.cuda_graph_modules": ["attn"], "model.gradient_accumulation_fusion": True},
        {"te_version": "2.11"},
        {"te_version": "2.12"},
    ),
    Case(
        "delay-wgrad-graph-scope-te-2.12",
        {**DW, **TE_GRAPH, "model.cuda_graph_modules": ["moe_router"], "model.moe_shared_expert_intermediate_size": 64},
        {**DW, **TE_GRAPH, "model.cuda_graph_modules": ["moe_router"]},
        {"te_version": "2.11"},
        {"te_version": "2.11"},
        name="router-with-shared-expert",
    ),
    Case(
        "delay-wgrad-graph-scope-te-2.12",
        {**DW, "model.cuda_graph_impl": "local", "model.cuda_graph_modules": []},
        {**DW, "model.cuda_graph_impl": "none"},
        {"te_version": "2.11"},
        {"te_version": "2.11"},
        name="whole-layer-local",
    ),
    Case(
        "delay-wgrad-graph-scope-needs-grad-accum-fusion",
        {**DW, **TE_GRAPH, "model.cuda_graph_modules": ["attn"]},
        {**DW, **TE_GRAPH, "model.cuda_graph_modules": ["attn"], "model.gradient_accumulation_fusion": True},
        {"te_version": "2.12"},
        {"te_version": "2.12"},
    ),
    Case(
        "delay-wgrad-graph-scope-no-attention-bias",
        {**DW, **TE_GRAPH, "model.cuda_graph_modules": ["attn"], "model.add_qkv_bias": True},
        {**DW, **TE_GRAPH, "model.cuda_graph_modules": ["attn"]},
        {"te_version": "2.12"},
        {"te_version": "2.12"},
    ),
    Case("te-cuda-graph-needs-te", TE_GRAPH, TE_GRAPH, {}, {"te_version": "2.12"}),
    Case(
        "shared-expert-overlap-needs-alltoall-or-flex",
        {**OFF, "model.moe_shared_expert_overlap": True, "model.moe_token_dispatcher_type": "allgather"},
        {**OFF, "model.moe_shared_expert_overlap": True},
    ),
    Case(
        "shared-expert-overlap-needs-shared-expert",
        {**OFF, "model.moe_shared_expert_overlap": True},
        {**OFF, "model.moe_shared_expert_overlap": True, "model.moe_shared_expert_intermediate_size": 64},
    ),
    Case(
        "tp-overlap-needs-tp",
        {**TP_OVERLAP, "model.tensor_model_parallel_size": 1},
        TP_OVERLAP,
        {"te_version": "2.12"},
        {"te_version": "2.12"},
    ),
    Case(
        "tp-overlap-needs-sequence-parallel",
        {**TP_OVERLAP, "model.sequence_parallel": False},
        TP_OVERLAP,
        {"te_version": "2.12"},
        {"te_version": "2.12"},
    ),
    Case("tp-overlap-needs-te", TP_OVERLAP, TP_OVERLAP, {}, {"te_version": "2.12"}),
    Case(
        "tp-overlap-userbuffers-not-initialised",
        TP_OVERLAP,
        {**TP_OVERLAP, "comm_overlap.tp_comm_overlap": False},
        {"te_version": "2.12"},
        {"te_version": "2.12"},
    ),
    Case(
        "tp-overlap-cfg-needs-tp-overlap",
        {"comm_overlap.tp_comm_overlap_cfg": {"qkv_fprop": {"method": "ring_exchange"}}},
        {"comm_overlap.tp_comm_overlap_cfg": None},
    ),
    Case(
        "data-parallel-size-matches-layout",
        {"comm_overlap.data_parallel_size": 4},
        {"comm_overlap.data_parallel_size": 2},
    ),
    Case(
        "tp-comm-bootstrap-backend-known",
        {"comm_overlap.tp_comm_bootstrap_backend": "ucx"},
        {"comm_overlap.tp_comm_bootstrap_backend": "gloo"},
    ),
    Case(
        "p2p-overlap-needs-interleaved-pipeline",
        {"comm_overlap.overlap_p2p_comm": True},
        {
            "comm_overlap.overlap_p2p_comm": True,
            "model.pipeline_model_parallel_size": 2,
            "model.virtual_pipeline_model_parallel_size": 2,
        },
    ),
    Case(
        "p2p-overlap-needs-interleaved-pipeline",
        {**OFF, "comm_overlap.overlap_p2p_comm": True, "model.pipeline_model_parallel_size": 2},
        OFF,
        name="pp-without-vpp",
    ),
    Case(
        "p2p-overlap-excludes-batch-p2p",
        {"comm_overlap.overlap_p2p_comm": True, "comm_overlap.batch_p2p_comm": True},
        {"comm_overlap.overlap_p2p_comm": True, "comm_overlap.batch_p2p_comm": False},
    ),
    Case(
        "param-gather-overlap-needs-distributed-optimizer",
        {"comm_overlap.overlap_param_gather": True, "ddp.use_distributed_optimizer": False},
        {"comm_overlap.overlap_param_gather": True},
    ),
    Case(
        "dp-overlap-needs-nccl-on-gpus",
        {"comm_overlap.overlap_grad_reduce": True, "dist.distributed_backend": "gloo"},
        {
            "comm_overlap.overlap_grad_reduce": False,
            "comm_overlap.overlap_param_gather": False,
            "dist.distributed_backend": "gloo",
        },
    ),
    Case(
        "param-gather-with-step-needs-param-gather-overlap",
        {"comm_overlap.overlap_param_gather_with_optimizer_step": True, "comm_overlap.overlap_param_gather": False},
        {"comm_overlap.overlap_param_gather_with_optimizer_step": True, "comm_overlap.overlap_param_gather": True},
    ),
    Case(
        "defer-embedding-wgrad-needs-pipeline",
        {"comm_overlap.defer_embedding_wgrad_compute": True, "model.gradient_accumulation_fusion": True},
        {
            "comm_overlap.defer_embedding_wgrad_compute": True,
            "model.gradient_accumulation_fusion": True,
            "model.pipeline_model_parallel_size": 2,
            "model.virtual_pipeline_model_parallel_size": 2,
        },
    ),
    Case(
        "defer-embedding-wgrad-needs-grad-accum-fusion",
        {"comm_overlap.defer_embedding_wgrad_compute": True},
        {"comm_overlap.defer_embedding_wgrad_compute": True, "model.gradient_accumulation_fusion": True},
    ),
    Case("flex-backend-known", {**FLEX, "model.moe_flex_dispatcher_backend": "nixl"}, FLEX, H100, H100),
    Case(
        "flex-backend-known",
        {**FLEX, "model.moe_flex_dispatcher_backend": "nixl"},
        NCCLEP,
        H100,
        H100,
        name="ncclep-is-known",
    ),
    Case("flex-backend-needs-flex-dispatcher", {"model.moe_flex_dispatcher_backend": "deepep"}, FLEX, {}, H100),
    Case(
        "flex-dispatcher-needs-backend",
        {"model.moe_token_dispatcher_type": "flex"},
        {**FLEX, "model.moe_flex_dispatcher_backend": "hybridep"},
    ),
    Case("flex-backend-supported-on-gpu", FLEX, FLEX, GB200, H100),
    Case(
        "flex-backend-supported-on-gpu",
        {**FLEX, "model.moe_flex_dispatcher_backend": "hybridep"},
        {**FLEX, "model.moe_flex_dispatcher_backend": "hybridep"},
        {"device_capability": (12, 0)},
        GB200,
        name="hybridep",
    ),
    Case("flex-backend-supported-on-gpu", NCCLEP, NCCLEP, A100, GB200, name="ncclep"),
    Case("flex-backend-gpu-not-checked", FLEX, FLEX, {}, H100),
    Case(
        "flex-needs-deep-ep",
        FLEX,
        FLEX,
        {**H100, "cuda_available": True},
        {**H100, "cuda_available": True, "packages": {"deep_ep": True}},
    ),
    Case("flex-deep-ep-not-checked-on-cpu-host", FLEX, FLEX, H100, {**H100, "packages": {"deep_ep": True}}),
    Case(
        "flex-needs-deep-ep",
        FLEX,
        NCCLEP,
        {**H100, "cuda_available": True},
        {**H100, "cuda_available": True, "packages": {TE_NCCL_EP: True}},
        name="not-for-ncclep",
    ),
    Case(
        "ncclep-needs-te-nccl-ep",
        NCCLEP,
        NCCLEP,
        {**H100, "cuda_available": True, "packages": {TE_NCCL_EP: False}},
        {**H100, "cuda_available": True, "packages": {TE_NCCL_EP: True}},
    ),
    Case(
        "ncclep-te-nccl-ep-not-checked-on-cpu-host",
        NCCLEP,
        NCCLEP,
        {**H100, "packages": {TE_NCCL_EP: False}},
        {**H100, "packages": {TE_NCCL_EP: True}},
    ),
    Case(
        "flex-num-sms-needs-flex-dispatcher",
        {"model.moe_flex_dispatcher_num_sms": 24},
        {**FLEX, "model.moe_flex_dispatcher_num_sms": 24},
    ),
    Case(
        "flex-num-sms-needs-flex-dispatcher",
        {"model.moe_hybridep_num_sms": 16},
        {**HYBRIDEP, "model.moe_hybridep_num_sms": 16},
        name="deprecated-name",
    ),
    Case(
        "flex-num-sms-one-value",
        {**FLEX, "model.moe_flex_dispatcher_num_sms": 24, "model.moe_deepep_num_sms": 20},
        {**FLEX, "model.moe_flex_dispatcher_num_sms": 24, "model.moe_deepep_num_sms": 24},
    ),
    Case(
        "flex-num-sms-one-value",
        {**HYBRIDEP, "model.moe_deepep_num_sms": 20, "model.moe_hybridep_num_sms": 16},
        {**HYBRIDEP, "model.moe_hybridep_num_sms": 16},
        name="two-deprecated-names",
    ),
    Case(
        "flex-num-sms-positive",
        {**FLEX, "model.moe_flex_dispatcher_num_sms": 0},
        {**FLEX, "model.moe_flex_dispatcher_num_sms": 2},
    ),
    Case(
        "flex-num-sms-positive",
        {**NCCLEP, "model.moe_flex_dispatcher_num_sms": True},
        {**NCCLEP, "model.moe_flex_dispatcher_num_sms": None},
        name="bool",
    ),
    Case(
        "deepep-num-sms-even",
        {**FLEX, "model.moe_flex_dispatcher_num_sms": 21},
        {**FLEX, "model.moe_flex_dispatcher_num_sms": 20},
    ),
    Case(
        "deepep-num-sms-even",
        {**FLEX, "model.moe_deepep_num_sms": 21},
        {**HYBRIDEP, "model.moe_hybridep_num_sms": 21},
        name="deprecated-name-hybridep-odd-ok",
    ),
    Case("flex-backend-needs-tp-x-ep", {**OFF, **NCCLEP, "model.expert_model_parallel_size": 1}, NCCLEP),
    Case(
        "flex-backend-needs-tp-x-ep",
        {**OFF, **FLEX, "model.expert_model_parallel_size": 1},
        {**OFF, **HYBRIDEP, "model.expert_model_parallel_size": 1},
        name="deepep-not-hybridep",
    ),
    Case(
        "flex-backend-needs-tp-x-ep",
        {**OFF, **FLEX, "model.expert_model_parallel_size": 1},
        {**OFF, **FLEX, "model.expert_model_parallel_size": 1, "model.num_moe_experts": None},
        name="dense-model-builds-no-dispatcher",
    ),
    Case("flex-dispatcher-needs-moe-layers", {**OFF, **FLEX, "model.num_moe_experts": None}, {**OFF, **FLEX}),
    Case(
        "flex-dispatcher-needs-moe-layers",
        {**OFF, **FLEX, "model.num_moe_experts": 0},
        {**OFF, "model.num_moe_experts": 0},
        name="zero-experts-alltoall",
    ),
    Case(
        "rank-capacity-factor-needs-hybridep-or-ncclep", {**FLEX, "model.moe_expert_rank_capacity_factor": 1.5}, NCCLEP
    ),
    Case(
        "rank-capacity-factor-needs-hybridep-or-ncclep",
        {"model.moe_expert_rank_capacity_factor": 1.5},
        {**HYBRIDEP, **TE_FUSED_EXPERTS, "model.moe_expert_rank_capacity_factor": 1.5},
        {},
        TE,
        name="alltoall",
    ),
    Case("rank-capacity-factor-positive", {**NCCLEP, "model.moe_expert_rank_capacity_factor": 0}, NCCLEP),
    Case(
        "rank-capacity-factor-positive", {**NCCLEP, "model.moe_expert_rank_capacity_factor": "1.5"}, NCCLEP, name="text"
    ),
    Case(
        "rank-capacity-factor-hybridep-needs-op-fuser",
        {**HYBRIDEP, "model.moe_expert_rank_capacity_factor": 1.5},
        {**HYBRIDEP, **TE_FUSED_EXPERTS, "model.moe_expert_rank_capacity_factor": 1.5},
        TE,
        TE,
    ),
    Case(
        "rank-capacity-factor-hybridep-needs-op-fuser",
        {
            **HYBRIDEP,
            **TE_FUSED_EXPERTS,
            "model.layer_spec": "torch_native",
            "model.moe_expert_rank_capacity_factor": 1.5,
        },
        {**HYBRIDEP, **TE_FUSED_EXPERTS, "model.moe_expert_rank_capacity_factor": 1.5},
        TE,
        TE,
        name="torch-native-experts",
    ),
    Case("ncclep-needs-rank-capacity-factor", {**NCCLEP, "model.moe_expert_rank_capacity_factor": None}, NCCLEP),
    Case("ncclep-settings-need-ncclep", {**FLEX, "model.moe_ncclep_static_shape": True}, STATIC, TE, TE),
    Case(
        "ncclep-settings-need-ncclep",
        {**OFF, "model.moe_ncclep_zero_copy": True},
        {**STATIC, "model.moe_ncclep_zero_copy": True},
        TE,
        TE,
        name="zero-copy",
    ),
    Case(
        "ncclep-zero-copy-needs-static-shape",
        {**NCCLEP, "model.moe_ncclep_zero_copy": True},
        {**STATIC, "model.moe_ncclep_zero_copy": True},
        TE,
        TE,
    ),
    Case(
        "ncclep-static-shape-needs-fused-grouped-experts",
        {**NCCLEP, "model.moe_ncclep_static_shape": True},
        STATIC,
        TE,
        TE,
    ),
    Case(
        "ncclep-static-shape-needs-fused-grouped-experts",
        {**STATIC, "model.use_transformer_engine_op_fuser": False},
        STATIC,
        TE,
        TE,
        name="op-fuser-off",
    ),
    Case(
        "ncclep-static-shape-low-precision-needs-blackwell",
        {**STATIC, "mixed_precision": "bf16_with_mxfp8_mixed"},
        {**STATIC, "mixed_precision": "bf16_with_mxfp8_mixed"},
        {**TE, **H100},
        {**TE, **GB200},
    ),
    Case(
        "ncclep-static-shape-low-precision-needs-blackwell",
        {**STATIC, "mixed_precision": "bf16_with_mxfp8_mixed"},
        STATIC,
        {**TE, **H100},
        {**TE, **H100},
        name="bf16-on-hopper",
    ),
    Case("ncclep-ep-overlap-syncs-without-static-shape", NCCLEP, STATIC, {}, TE),
    Case("ep-early-attn-release-needs-ep-overlap", {**OFF, **EARLY}, EARLY),
    Case(
        "dispatch-wgrad-overlap-not-built",
        {**OFF, "model.overlap_dispatch_backward_with_experts_wgrad": True},
        {**OFF, "model.overlap_dispatch_backward_with_experts_wgrad": False},
        TE,
        TE,
    ),
    Case(
        "activation-offload-needs-gpu",
        {**OFFLOAD, "model.offload_modules": ["core_attn"], "dist.device": "cpu"},
        {**OFFLOAD, "model.offload_modules": ["core_attn"]},
    ),
    Case(
        "activation-offload-needs-known-modules",
        {**OFFLOAD, "model.offload_modules": []},
        {**OFFLOAD, "model.offload_modules": ["qkv_linear"]},
    ),
    Case(
        "activation-offload-needs-known-modules",
        {**OFFLOAD, "model.offload_modules": ["attention"]},
        {**OFFLOAD, "model.offload_modules": ["attn_norm", "mlp_norm"]},
        name="unknown-name",
    ),
    Case(
        "activation-offload-attn-proj-needs-core-attn",
        {**OFFLOAD, "model.offload_modules": ["attn_proj"]},
        {**OFFLOAD, "model.offload_modules": ["core_attn", "attn_proj"]},
    ),
    Case(
        "activation-offload-expert-modules-need-te-experts",
        {**OFFLOAD, "model.offload_modules": ["moe_act"]},
        {**OFFLOAD, "model.offload_modules": ["moe_act"], "model.layer_spec": "transformer_engine"},
        TE,
        TE,
    ),
    Case(
        "activation-offload-expert-modules-need-te-experts",
        {**OFFLOAD, "model.offload_modules": ["fused_group_mlp"], "model.layer_spec": "transformer_engine"},
        {**OFFLOAD, "model.offload_modules": ["fused_group_mlp"], **TE_FUSED_EXPERTS},
        TE,
        TE,
        name="fused-group-mlp",
    ),
    Case(
        "activation-offload-torch-native-norms-only",
        {**OFFLOAD, "model.offload_modules": ["qkv_linear"]},
        {**OFFLOAD, "model.offload_modules": ["attn_norm", "mlp_norm"]},
    ),
    Case(
        "activation-offload-torch-native-norms-only",
        {**OFFLOAD, "model.offload_modules": ["core_attn"]},
        {**OFFLOAD, "model.offload_modules": ["core_attn"], "model.layer_spec": "local"},
        name="local-layers",
    ),
    Case(
        "offload-modules-need-activation-offload",
        {"model.offload_modules": ["core_attn"]},
        {**OFFLOAD, "model.offload_modules": ["core_attn"]},
    ),
    Case(
        "ncclep-ep-overlap-no-expert-fc1-offload",
        {**STATIC, **OFFLOAD, "model.offload_modules": ["expert_fc1"]},
        {**STATIC, **OFF, **OFFLOAD, "model.offload_modules": ["expert_fc1"]},
        TE,
        TE,
    ),
    Case("paged-stash-not-built", {"model.moe_paged_stash": True}, {"model.moe_paged_stash": False}),
    Case(
        "paged-stash-sizes-need-paged-stash",
        {"model.moe_paged_stash_page_size": 128},
        {"model.moe_paged_stash_page_size": 128, "model.moe_paged_stash": True},
    ),
    Case(
        "paged-stash-sizes-need-paged-stash",
        {"model.moe_paged_stash_buffer_size_factor_cpu": 1.0},
        {},
        name="default-sizes",
    ),
] + [
    Case(f"overlap-switch-is-bool:{name}", {f"comm_overlap.{name}": 1}, {f"comm_overlap.{name}": False})
    for name in BOOL_SWITCHES
]


def _case_id(case: Case) -> str:
    return case.rule + (f"[{case.name}]" if case.name else "")


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_rule_reports_violation(case: Case) -> None:
    cfg = set_fields(ep_overlap_cfg(), case.violate)
    assert case.rule in violated_ids(cfg, ctx(**case.ctx_violate))


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_rule_accepts_satisfying_config(case: Case) -> None:
    cfg = set_fields(ep_overlap_cfg(), case.satisfy)
    assert case.rule not in violated_ids(cfg, ctx(**case.ctx_satisfy))


def test_every_rule_has_cases() -> None:
    assert {r.id for r in OVERLAP_RULES} == {c.rule for c in CASES}


def test_rule_records_are_complete_and_unique() -> None:
    ids = [r.id for r in OVERLAP_RULES]
    assert len(ids) == len(set(ids))
    for rule in OVERLAP_RULES:
        assert rule.fields and rule.message and rule.fix and rule.group != "general"
        assert rule.severity in ("error", "warning")


def test_base_config_has_no_overlap_violations() -> None:
    assert violated_ids(ep_overlap_cfg()) == set()


def test_violation_names_field_value_and_fix() -> None:
    cfg = set_fields(ep_overlap_cfg(), {"model.recompute_granularity": "full"})
    with pytest.raises(CommOverlapConfigError) as info:
        finalize(cfg)
    text = str(info.value)
    assert "model.recompute_granularity='full'" in text and "fix:" in text
    assert isinstance(info.value, ValueError)


def test_several_violations_reported_together() -> None:
    cfg = set_fields(
        ep_overlap_cfg(),
        {
            "model.expert_model_parallel_size": 1,
            "mixed_precision": "fp32",
            "model.recompute_granularity": "full",
            "model.moe_shared_expert_overlap": True,
            "comm_overlap.delay_wgrad_compute": True,
            "model.moe_flex_dispatcher_backend": "deepep",
        },
    )
    with pytest.raises(CommOverlapConfigError) as info:
        finalize(cfg)
    rules = {v.rule for v in info.value.violations}
    assert {
        "ep-overlap-needs-expert-parallel",
        "ep-overlap-needs-bf16-or-fp16",
        "ep-overlap-no-full-recompute",
        "ep-overlap-no-shared-expert-overlap",
        "flex-backend-needs-flex-dispatcher",
    } <= rules
    assert all(v.severity == "error" for v in info.value.violations)


def test_overlap_and_general_violations_in_one_error() -> None:
    cfg = set_fields(ep_overlap_cfg(), {"model.expert_model_parallel_size": 1, "train.train_iters": 0})
    with pytest.raises(CommOverlapConfigError) as info:
        finalize(cfg)
    assert {"ep-overlap-needs-expert-parallel", "range:train.train_iters"} <= {v.rule for v in info.value.violations}


def test_warnings_do_not_fail_validation(caplog) -> None:
    cfg = set_fields(ep_overlap_cfg(), {**DW, "model.layer_spec": "local"})
    resolved = finalize(cfg)
    assert resolved.model.delay_wgrad_compute and resolved.ddp.delay_wgrad_compute
    assert "delay-wgrad-no-op-with-local-layers" in caplog.text


# --------------------------------------------------------------------------------------------
# The README's Python snippet on the 30B recipe, and each unmet prerequisite via cfg.validate()
# --------------------------------------------------------------------------------------------


def _spec_snippet_cfg():
    cfg = qwen3_30b_a3b_pretrain_config()
    cfg.comm_overlap.overlap_moe_expert_parallel_comm = True
    cfg.comm_overlap.delay_wgrad_compute = True
    cfg.model.moe_shared_expert_overlap = False
    return cfg


def test_spec_snippet_validates_without_gpu() -> None:
    resolved = _spec_snippet_cfg().validate()
    assert resolved.model.overlap_moe_expert_parallel_comm is True
    assert resolved.model.delay_wgrad_compute is True and resolved.ddp.delay_wgrad_compute is True


PREREQUISITES = [
    ("model.expert_model_parallel_size", {"model.expert_model_parallel_size": 1}),
    ("model.num_moe_experts", {"model.num_moe_experts": 1}),
    ("model.moe_token_dispatcher_type", {"model.moe_token_dispatcher_type": "allgather"}),
    ("mixed_precision", {"mixed_precision": "fp32"}),
    ("model.virtual_pipeline_model_parallel_size", {"model.pipeline_model_parallel_size": 2}),
    ("model.recompute_granularity", {"model.recompute_granularity": "full"}),
    ("model.recompute_method", {"model.recompute_method": "uniform"}),
    ("model.recompute_num_layers", {"model.recompute_num_layers": 2}),
    ("model.recompute_modules", {"model.recompute_granularity": "selective", "model.recompute_modules": ["moe"]}),
    ("model.moe_shared_expert_overlap", {"model.moe_shared_expert_overlap": True}),
    ("model.mtp_num_layers", {"model.mtp_num_layers": 2}),
    ("comm_overlap.overlap_moe_expert_parallel_comm", {"comm_overlap.overlap_moe_expert_parallel_comm": 1}),
    ("comm_overlap.overlap_moe_expert_parallel_comm", {"comm_overlap.overlap_moe_expert_parallel_comm": False}),
]


@pytest.mark.parametrize(
    "field_name, change", PREREQUISITES, ids=[f"{p[0]}={list(p[1].values())[-1]}" for p in PREREQUISITES]
)
def test_each_unmet_prerequisite_fails_validate(field_name: str, change: dict[str, Any]) -> None:
    cfg = set_fields(_spec_snippet_cfg(), change)
    with pytest.raises(CommOverlapConfigError) as info:
        cfg.validate()
    assert field_name in info.value.fields


def test_old_torch_fails_validate(monkeypatch) -> None:
    monkeypatch.setattr(torch, "__version__", "2.5.1+cpu")
    with pytest.raises(CommOverlapConfigError) as info:
        _spec_snippet_cfg().validate()
    assert [v.rule for v in info.value.violations] == ["ep-overlap-needs-torch-2.6"]


# --------------------------------------------------------------------------------------------
# Resolution: computed defaults, precedence of explicit values, provenance, later edits
# --------------------------------------------------------------------------------------------


def test_dataclass_is_keyword_only_and_all_unset() -> None:
    with pytest.raises(TypeError):
        CommOverlapConfig(True)  # type: ignore[misc]
    assert all(getattr(CommOverlapConfig(), f.name) is None for f in OVERLAP_FIELDS)
    # data_parallel_size is what the switches are decided for, not a switch
    assert {f.name for f in OVERLAP_FIELDS} == set(CommOverlapConfig.__dataclass_fields__) - {"data_parallel_size"}


def test_bool_switches_are_the_dataclass_bool_fields() -> None:
    """The field table says which switches are booleans; the dataclass annotations must agree."""
    hints = typing.get_type_hints(CommOverlapConfig)
    annotated = {name for name in CommOverlapConfig.__dataclass_fields__ if hints[name] == bool | None}
    assert set(BOOL_SWITCHES) == annotated


@pytest.mark.parametrize(
    "pp, vpp, expect_overlap, expect_batch",
    [(1, None, False, False), (2, None, False, True), (2, 2, True, False)],
)
def test_computed_p2p_defaults(pp, vpp, expect_overlap, expect_batch) -> None:
    cfg = set_fields(
        ep_overlap_cfg(),
        {**OFF, "model.pipeline_model_parallel_size": pp, "model.virtual_pipeline_model_parallel_size": vpp},
    )
    resolved = finalize(cfg, ctx(world_size=4))
    assert (resolved.model.overlap_p2p_comm, resolved.model.batch_p2p_comm) == (expect_overlap, expect_batch)
    assert resolved.provenance["comm_overlap.overlap_p2p_comm"] == "computed"


@pytest.mark.parametrize(
    "world, dist_opt, expected",
    [(4, True, True), (1, True, False), (4, False, False), (None, True, False)],
    ids=["dp2-distopt", "dp1", "no-distopt", "world-unknown"],
)
def test_computed_data_parallel_defaults(world, dist_opt, expected) -> None:
    cfg = set_fields(ep_overlap_cfg(), {"ddp.use_distributed_optimizer": dist_opt})
    cfg.model.expert_model_parallel_size = 1
    cfg.comm_overlap.overlap_moe_expert_parallel_comm = False
    resolved = finalize(cfg, ctx(world_size=world))
    assert resolved.ddp.overlap_grad_reduce is expected
    assert resolved.ddp.overlap_param_gather is expected and resolved.optimizer.overlap_param_gather is expected
    assert (resolved.ddp.bucket_size == DEFAULT_BUCKET_SIZE) is expected


def test_explicit_values_beat_computed_defaults() -> None:
    cfg = ep_overlap_cfg()
    cfg.comm_overlap.overlap_grad_reduce = False
    cfg.comm_overlap.bucket_size = 64 * 1024 * 1024
    cfg.provenance["comm_overlap.overlap_grad_reduce"] = "cli"
    resolved = finalize(cfg, ctx(world_size=8))
    assert resolved.ddp.overlap_grad_reduce is False
    assert resolved.ddp.bucket_size == 64 * 1024 * 1024
    assert resolved.ddp.overlap_param_gather is True  # still computed
    values = effective_overlap_values(cfg, ctx(world_size=8))
    assert values["overlap_grad_reduce"].source == "cli"
    assert values["bucket_size"].source == "recipe"
    assert values["overlap_param_gather"].source == "computed"


def test_explicit_batch_p2p_steers_computed_overlap_p2p() -> None:
    cfg = set_fields(
        ep_overlap_cfg(),
        {
            "model.pipeline_model_parallel_size": 2,
            "model.virtual_pipeline_model_parallel_size": 2,
            "comm_overlap.batch_p2p_comm": True,
        },
    )
    resolved = finalize(cfg, ctx(world_size=4))
    assert resolved.model.batch_p2p_comm is True and resolved.model.overlap_p2p_comm is False


def test_values_applied_to_model_ddp_optimizer_once() -> None:
    cfg = set_fields(ep_overlap_cfg(), {**DW, "comm_overlap.overlap_param_gather": True})
    resolved = finalize(cfg)
    assert resolved.model.overlap_moe_expert_parallel_comm is True
    assert resolved.model.delay_wgrad_compute is True and resolved.ddp.delay_wgrad_compute is True
    assert resolved.ddp.overlap_param_gather is True and resolved.optimizer.overlap_param_gather is True
    # written back: the resolved copy describes itself (DP=2 with the distributed optimizer)
    assert resolved.comm_overlap.overlap_grad_reduce is resolved.ddp.overlap_grad_reduce is True


def test_user_owners_untouched_and_later_edits_take_effect() -> None:
    cfg = ep_overlap_cfg()
    cfg.comm_overlap.overlap_moe_expert_parallel_comm = False
    first = cfg.validate(world_size=WORLD)
    assert first.model.overlap_moe_expert_parallel_comm is False
    cfg.comm_overlap.overlap_moe_expert_parallel_comm = True
    cfg.comm_overlap.delay_wgrad_compute = True
    second = cfg.validate(world_size=WORLD)
    assert second.model.overlap_moe_expert_parallel_comm is True and second.ddp.delay_wgrad_compute is True
    assert cfg.comm_overlap.overlap_grad_reduce is None  # the owner stays "framework decides"
    assert cfg.model.overlap_moe_expert_parallel_comm is True and cfg.ddp.overlap_grad_reduce is True  # copies
    cfg.model.recompute_granularity = "full"
    with pytest.raises(CommOverlapConfigError):
        cfg.validate(world_size=WORLD)


def test_resolution_is_idempotent_on_resolved_copy() -> None:
    resolved = finalize(ep_overlap_cfg(), ctx(world_size=8))
    again = finalize(resolved, ctx(world_size=8))
    for spec in OVERLAP_FIELDS:
        assert getattr(again.comm_overlap, spec.name) == getattr(resolved.comm_overlap, spec.name)
    values = effective_overlap_values(resolved, ctx(world_size=8))
    assert values["overlap_grad_reduce"].value is True and values["overlap_grad_reduce"].source == "computed"
    assert "comm_overlap.bucket_size" in format_effective_values(values)


# --------------------------------------------------------------------------------------------
# Ownership: comm_overlap owns the switch; its megatron-facing copies are never inputs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DirectWrite:
    """A copy written in Python before ``validate()``: refused unless it equals the effective value."""

    owner_value: Any
    copies: dict[str, Any]
    refused: tuple[str, ...]
    name: str


DIRECT_WRITES = [
    DirectWrite(
        False,
        {"model.overlap_moe_expert_parallel_comm": True},
        ("model.overlap_moe_expert_parallel_comm",),
        "copy-against-recipe-owner",
    ),
    DirectWrite(
        None,
        {"model.overlap_moe_expert_parallel_comm": True},
        ("model.overlap_moe_expert_parallel_comm",),
        "copy-while-owner-unset-is-not-an-alias",
    ),
    DirectWrite(True, {"model.overlap_moe_expert_parallel_comm": True}, (), "copy-equal-to-owner"),
    DirectWrite(False, {"ddp.delay_wgrad_compute": True}, ("ddp.delay_wgrad_compute",), "ddp-copy"),
    DirectWrite(
        None,
        {"ddp.delay_wgrad_compute": True, "model.delay_wgrad_compute": False},
        ("ddp.delay_wgrad_compute",),
        "disagreeing-copies",
    ),
]


@pytest.mark.parametrize("case", DIRECT_WRITES, ids=lambda c: c.name)
def test_copy_written_in_python_is_refused_naming_the_owner(case: DirectWrite) -> None:
    cfg = ep_overlap_cfg()
    switch = next(iter(case.copies)).split(".")[1]
    setattr(cfg.comm_overlap, switch, case.owner_value)
    set_fields(cfg, case.copies)
    if not case.refused:
        assert finalize(cfg).comm_overlap.overlap_moe_expert_parallel_comm is True
        return
    with pytest.raises(CommOverlapConfigError) as info:
        finalize(cfg)
    assert [v.rule for v in info.value.violations] == ["owned-field-set-directly"] * len(case.refused)
    assert {v.fields[0] for v in info.value.violations} == set(case.refused)
    assert all(v.fields[1] == f"comm_overlap.{switch}" for v in info.value.violations)
    assert f"set comm_overlap.{switch}=" in str(info.value)


@pytest.mark.parametrize(
    "overrides, refused",
    [
        (["model.overlap_moe_expert_parallel_comm=false"], "model.overlap_moe_expert_parallel_comm"),
        (["comm_overlap.delay_wgrad_compute=null", "ddp.delay_wgrad_compute=true"], "ddp.delay_wgrad_compute"),
        (["optimizer.overlap_param_gather=true"], "optimizer.overlap_param_gather"),
        (["model.bf16=false"], "model.bf16"),
    ],
    ids=["against-owner", "owner-null", "optimizer-copy", "precision-flag"],
)
def test_override_writing_a_copy_fails_when_parsed_with_the_owner(overrides, refused) -> None:
    with pytest.raises(OverrideError) as info:
        apply_overrides(ep_overlap_cfg(), overrides)
    (violation,) = info.value.violations
    owner = ownership.OWNER_OF[refused].owner
    assert violation.rule == "override-owned-field" and violation.fields == (refused, owner)
    assert owner in violation.message and owner in violation.fix


def test_override_giving_a_copy_its_owners_value_is_accepted() -> None:
    """A saved config carries the copies with their owners' values and must load back."""
    cfg = apply_overrides(
        ep_overlap_cfg(),
        [
            "comm_overlap.delay_wgrad_compute=true",
            "model.delay_wgrad_compute=true",
            "ddp.delay_wgrad_compute=true",
            "model.bf16=true",
        ],
    )
    resolved = finalize(cfg)
    assert resolved.model.delay_wgrad_compute is True and resolved.ddp.delay_wgrad_compute is True


def test_validate_writes_effective_values_into_the_callers_copies() -> None:
    """The copies of the config a user holds say what the run uses; the owners stay as written."""
    cfg = _spec_snippet_cfg()
    resolved = cfg.validate(world_size=16)
    for spec in OVERLAP_FIELDS:
        for target in spec.targets:
            assert read_field(cfg, target) == read_field(resolved, target) == getattr(resolved.comm_overlap, spec.name)
    assert cfg.model.overlap_moe_expert_parallel_comm is True and cfg.ddp.delay_wgrad_compute is True
    assert cfg.comm_overlap.overlap_grad_reduce is None and cfg.ddp.overlap_grad_reduce is True
    assert cfg.model.bf16 is True and cfg.optimizer.params_dtype is torch.bfloat16


def test_owner_changed_after_validate_moves_the_copies_with_it() -> None:
    cfg = _spec_snippet_cfg()
    cfg.validate(world_size=16)
    cfg.comm_overlap.overlap_moe_expert_parallel_comm = False
    cfg.comm_overlap.delay_wgrad_compute = False
    assert cfg.validate(world_size=16).model.overlap_moe_expert_parallel_comm is False
    assert cfg.model.overlap_moe_expert_parallel_comm is False and cfg.ddp.delay_wgrad_compute is False
    cfg.model.overlap_moe_expert_parallel_comm = True  # a direct write after a validate is still seen
    with pytest.raises(CommOverlapConfigError, match="owned-field-set-directly"):
        cfg.validate(world_size=16)


def test_recipe_leaves_ep_overlap_off_but_switchable() -> None:
    cfg = qwen3_30b_a3b_pretrain_8gpu_config()
    assert cfg.validate().model.overlap_moe_expert_parallel_comm is False
    cfg.comm_overlap.overlap_moe_expert_parallel_comm = True
    cfg.model.virtual_pipeline_model_parallel_size = 2
    assert cfg.validate().model.overlap_moe_expert_parallel_comm is True


# --------------------------------------------------------------------------------------------
# Helpers, docs, hygiene
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "modules, scope, expected",
    [
        ("full", None, frozenset()),
        ([], None, frozenset()),
        ("attn,moe_router", None, frozenset({"attn", "moe_router"})),
        (["moe"], None, frozenset({"moe"})),
        ("full", ["mlp"], frozenset({"mlp"})),
    ],
)
def test_graph_modules_reads_both_fields(modules, scope, expected) -> None:
    cfg = ep_overlap_cfg()
    cfg.model.cuda_graph_modules = modules
    cfg.model.cuda_graph_scope = scope
    assert graph_modules(cfg.model) == expected


def test_graph_modules_reads_normalised_enums() -> None:
    from megatron.core.transformer.enums import CudaGraphModule

    cfg = ep_overlap_cfg()
    cfg.model.cuda_graph_modules = [CudaGraphModule.attn]
    assert graph_modules(cfg.model) == {"attn"}


def test_docs_page_is_generated_from_the_table() -> None:
    page = (REPO / overlap_docs.DOCS_PATH).read_text()
    assert page == render_docs(), "run: uv run python -m megatron.bridge.training.comm_overlap --write-docs"
    for rule in OVERLAP_RULES:
        assert rule.id in page or rule.group == "types"
    for rule_id, _ in overlap_docs.OWNERSHIP_CHECKS:
        assert rule_id in ownership.OWNERSHIP_RULE_IDS and rule_id in page


def test_docs_command_of_the_public_module_writes_page(tmp_path, monkeypatch) -> None:
    """``python -m megatron.bridge.training.comm_overlap --write-docs`` (the command the page names)."""
    monkeypatch.setattr("sys.argv", ["comm_overlap", "--write-docs", "--root", str(tmp_path)])
    with pytest.raises(SystemExit) as done:
        runpy.run_module("megatron.bridge.training.comm_overlap", run_name="__main__")
    assert done.value.code == 0
    assert (tmp_path / overlap_docs.DOCS_PATH).read_text() == render_docs()


@pytest.mark.parametrize(
    "module",
    [
        comm_overlap,
        flex_dispatcher_backend,
        overlap_report,
        finalize_module,
        gpu_catalog,
        ownership,
        fields,
        resolution,
        rules,
        facts,
        overlap_docs,
    ],
    ids=lambda m: m.__name__.rsplit(".", 1)[-1],
)
def test_no_bare_assert_in_validation_code(module) -> None:
    tree = ast.parse(inspect.getsource(module))
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Assert)]


def test_overlap_error_is_importable_where_the_config_is() -> None:
    from megatron.bridge.training import errors
    from megatron.bridge.training.comm_overlap import CommOverlapConfigError as public

    assert public is errors.CommOverlapConfigError
    with pytest.raises(public):
        set_fields(ep_overlap_cfg(), {"model.expert_model_parallel_size": 1}).validate(world_size=WORLD)


def test_general_errors_keep_their_type() -> None:
    cfg = ep_overlap_cfg()
    cfg.train.train_iters = 0
    with pytest.raises(ConfigValidationError) as info:
        finalize(copy.deepcopy(cfg))
    assert not isinstance(info.value, CommOverlapConfigError)


def test_comm_overlap_none_means_all_unset() -> None:
    cfg = ep_overlap_cfg()
    cfg.comm_overlap = None
    resolved = finalize(cfg, ctx(world_size=4))
    assert resolved.model.overlap_moe_expert_parallel_comm is False
    assert resolved.ddp.overlap_grad_reduce is True
    assert effective_overlap_values(cfg, ctx())["overlap_moe_expert_parallel_comm"].value is False
    assert "moe_ep_overlap" not in resolve_config(cfg, ctx=ctx()).report.active


def test_gloo_on_gpus_computes_dp_overlap_off() -> None:
    cfg = qwen3_30b_a3b_pretrain_config()
    cfg.dist.distributed_backend = "gloo"
    values = effective_overlap_values(cfg, ctx(world_size=32))
    assert values["overlap_grad_reduce"].value is False
    assert "gloo" in values["overlap_grad_reduce"].detail
    cfg.dist.distributed_backend = None
    assert effective_overlap_values(cfg, ctx(world_size=32))["overlap_grad_reduce"].value is True
