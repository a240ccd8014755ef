"""Every communication-overlap prerequisite as data (consumed by the validator, the docs, the tests).

Rules are evaluated on the resolved copy of a config: each switch holds its effective value on its
owner (``comm_overlap.<switch>``), which is what they read.
"""

from __future__ import annotations

from packaging.version import Version

from megatron.bridge.training.config_stages.facts.megatron_compat import graph_modules
from megatron.bridge.training.config_stages.facts.overlap_facts import (
    dw_graph,
    dw_on,
    dw_te,
    ep_on,
    experts_defer_wgrad,
    half_precision,
    has_shared_expert,
    layers_use_te,
    te_at_least,
    torch_text,
)
from megatron.bridge.training.config_stages.facts.overlap_fields import BOOL_SWITCHES, gloo_on_cuda
from megatron.bridge.training.config_stages.facts.parallel_layout import data_parallel_size, micro_batches_per_step
from megatron.bridge.training.config_stages.rules.flex_rules import FLEX_RULES, FLEX_SETTING_RULES
from megatron.bridge.training.config_stages.rules.overlap_knob_rules import (
    ACTIVATION_MEMORY_RULES,
    EP_OVERLAP_SCHEDULE_RULES,
)
from megatron.bridge.training.config_stages.schema.rule_base import TE_VERSION_VALUE, Rule

_TE = TE_VERSION_VALUE
_RECOMPUTE_FIX = "use selective recompute (recompute_granularity=selective, e.g. recompute_modules=[moe_act])"
_DW_FIX_OFF = "or set comm_overlap.delay_wgrad_compute=false"
_EP_OFF = "comm_overlap.overlap_moe_expert_parallel_comm=false"


def _two_micro_batches(cfg, ctx) -> bool:
    """At least two micro-batches per step (an unknown count: the rule does not apply)."""
    count = micro_batches_per_step(cfg, ctx)
    return count is None or count >= 2


def _co(name: str):
    """Predicate: the switch ``comm_overlap.<name>`` is on (its effective value)."""
    return lambda cfg, ctx: bool(getattr(cfg.comm_overlap, name))


EP_OVERLAP_RULES: tuple[Rule, ...] = (
    Rule(
        id="ep-overlap-needs-expert-parallel",
        group="ep-overlap",
        fields=("model.expert_model_parallel_size",),
        applies=ep_on,
        holds=lambda cfg, ctx: cfg.model.expert_model_parallel_size > 1,
        message="EP overlap hides the expert-parallel all-to-all; it needs expert parallelism",
        fix=f"set model.expert_model_parallel_size > 1, or {_EP_OFF}",
    ),
    Rule(
        id="ep-overlap-needs-moe-experts",
        group="ep-overlap",
        fields=("model.num_moe_experts",),
        applies=ep_on,
        holds=lambda cfg, ctx: (cfg.model.num_moe_experts or 0) > 1,
        message="EP overlap needs an MoE model with more than one expert",
        fix=f"set model.num_moe_experts > 1, or {_EP_OFF}",
    ),
    Rule(
        id="ep-overlap-needs-alltoall-or-flex",
        group="ep-overlap",
        fields=("model.moe_token_dispatcher_type",),
        applies=ep_on,
        holds=lambda cfg, ctx: cfg.model.moe_token_dispatcher_type in ("alltoall", "flex"),
        message="EP overlap runs only with the alltoall or flex token dispatcher",
        fix="set model.moe_token_dispatcher_type=alltoall (or flex with a backend)",
    ),
    Rule(
        id="ep-overlap-needs-bf16-or-fp16",
        group="ep-overlap",
        fields=("mixed_precision", "model.bf16", "model.fp16"),
        applies=ep_on,
        holds=half_precision,
        message="EP overlap needs a bf16 or fp16 model (precision is owned by mixed_precision; with "
        "mixed_precision=null by the model's own dtype flags)",
        fix="set mixed_precision=bf16_mixed (-c bf16) or fp16_mixed (with mixed_precision=null: "
        "model.bf16=true or model.fp16=true)",
    ),
    Rule(
        id="ep-overlap-pp-needs-vpp",
        group="ep-overlap",
        fields=("model.pipeline_model_parallel_size", "model.virtual_pipeline_model_parallel_size"),
        applies=lambda cfg, ctx: ep_on(cfg, ctx) and cfg.model.pipeline_model_parallel_size > 1,
        holds=lambda cfg, ctx: cfg.model.virtual_pipeline_model_parallel_size is not None,
        message="with pipeline parallelism the overlap needs the interleaved schedule: PP without "
        "virtual pipeline stages cannot interleave the micro-batches",
        fix="set model.virtual_pipeline_model_parallel_size (e.g. 2), or pipeline_model_parallel_size=1",
    ),
    Rule(
        id="ep-overlap-no-full-recompute",
        group="ep-overlap",
        fields=("model.recompute_granularity",),
        applies=ep_on,
        holds=lambda cfg, ctx: cfg.model.recompute_granularity != "full",
        message="full recompute is not a companion of the EP-overlap path",
        fix=_RECOMPUTE_FIX,
    ),
    Rule(
        id="ep-overlap-no-recompute-method",
        group="ep-overlap",
        fields=("model.recompute_method",),
        applies=ep_on,
        holds=lambda cfg, ctx: cfg.model.recompute_method is None,
        message="EP overlap needs recompute_method unset (uniform/block belong to full recompute)",
        fix="set model.recompute_method=null; " + _RECOMPUTE_FIX,
    ),
    Rule(
        id="ep-overlap-no-recompute-num-layers",
        group="ep-overlap",
        fields=("model.recompute_num_layers",),
        applies=ep_on,
        holds=lambda cfg, ctx: cfg.model.recompute_num_layers is None,
        message="EP overlap needs recompute_num_layers unset",
        fix="set model.recompute_num_layers=null",
    ),
    Rule(
        id="ep-overlap-no-moe-recompute",
        group="ep-overlap",
        fields=("model.recompute_modules",),
        applies=ep_on,
        holds=lambda cfg, ctx: "moe" not in (cfg.model.recompute_modules or ()),
        message="recomputing the whole MoE module re-runs the all-to-all the overlap hides",
        fix="remove 'moe' from model.recompute_modules (moe_act is fine)",
    ),
    Rule(
        id="ep-overlap-no-shared-expert-overlap",
        group="ep-overlap",
        fields=("model.moe_shared_expert_overlap",),
        applies=ep_on,
        holds=lambda cfg, ctx: not cfg.model.moe_shared_expert_overlap,
        message="shared-expert overlap conflicts with dispatch overlap: the EP-overlap schedule places "
        "the shared expert itself (megatron-core refuses the two together)",
        fix="set model.moe_shared_expert_overlap=false",
    ),
    Rule(
        id="ep-overlap-max-one-mtp-layer",
        group="ep-overlap",
        fields=("model.mtp_num_layers",),
        applies=ep_on,
        holds=lambda cfg, ctx: cfg.model.mtp_num_layers in (None, 0, 1),
        message="EP overlap supports at most one multi-token-prediction layer",
        fix="set model.mtp_num_layers to null, 0 or 1",
    ),
    Rule(
        id="ep-overlap-needs-torch-2.6",
        group="ep-overlap",
        fields=("comm_overlap.overlap_moe_expert_parallel_comm",),
        applies=ep_on,
        holds=lambda cfg, ctx: ctx.torch_version is None or ctx.torch_version >= Version("2.6"),
        message="EP overlap hangs with torch < 2.6",
        fix=f"install torch >= 2.6, or {_EP_OFF}",
        extra_values=(("torch", torch_text),),
    ),
    Rule(
        id="ep-overlap-te-cuda-graph-scope",
        group="ep-overlap",
        fields=("model.cuda_graph_impl", "model.cuda_graph_modules"),
        applies=lambda cfg, ctx: ep_on(cfg, ctx) and cfg.model.cuda_graph_impl == "transformer_engine",
        holds=lambda cfg, ctx: not (graph_modules(cfg.model) & {"moe", "mlp"}),
        message="with Transformer Engine CUDA graphs, the moe and mlp scopes cannot be captured with EP overlap",
        fix="drop moe/mlp from model.cuda_graph_modules (attn, moe_router, moe_preprocess are fine) "
        "or set model.cuda_graph_impl=none",
    ),
    Rule(
        id="ep-overlap-excludes-dispatch-wgrad-overlap",
        group="ep-overlap",
        fields=("model.overlap_dispatch_backward_with_experts_wgrad",),
        applies=ep_on,
        holds=lambda cfg, ctx: not cfg.model.overlap_dispatch_backward_with_experts_wgrad,
        message="overlapping the dispatch backward with expert wgrad is an alternative to EP overlap, "
        "not a companion (megatron-core rule)",
        fix="set model.overlap_dispatch_backward_with_experts_wgrad=false",
    ),
    Rule(
        id="ep-overlap-needs-two-micro-batches",
        group="ep-overlap",
        severity="warning",
        fields=("train.global_batch_size", "train.micro_batch_size"),
        applies=lambda cfg, ctx: ep_on(cfg, ctx) and micro_batches_per_step(cfg, ctx) is not None,
        holds=_two_micro_batches,
        message="the overlap interleaves two micro-batches; with one there is nothing to overlap",
        fix="raise train.global_batch_size to at least 2 x micro_batch_size x DP",
        extra_values=(("world_size", lambda ctx: ctx.world_size),),
    ),
)

DELAY_WGRAD_RULES: tuple[Rule, ...] = (
    Rule(
        id="delay-wgrad-needs-ep-overlap",
        group="delay-wgrad",
        fields=("comm_overlap.delay_wgrad_compute", "comm_overlap.overlap_moe_expert_parallel_comm"),
        applies=dw_on,
        holds=ep_on,
        message="delayed wgrad only exists inside the EP-overlap schedule",
        fix="set comm_overlap.overlap_moe_expert_parallel_comm=true (--moe_a2a_overlap true), "
        f"{_DW_FIX_OFF} (--moe_a2a_overlap false sets only the EP-overlap switch)",
    ),
    Rule(
        id="delay-wgrad-no-op-with-local-layers",
        group="delay-wgrad",
        severity="warning",
        fields=("comm_overlap.delay_wgrad_compute", "model.layer_spec"),
        applies=dw_on,
        holds=experts_defer_wgrad,
        message="with the plain megatron-core (local) layers delayed wgrad buys nothing (their "
        "linears compute wgrad in place); accepted so a CPU host can dry-run a TE cluster's config",
        fix="use layer_spec auto, torch_native or transformer_engine (their experts defer the "
        "wgrad GEMMs), " + _DW_FIX_OFF,
        extra_values=_TE,
    ),
    Rule(
        id="delay-wgrad-te-2.7",
        group="delay-wgrad",
        fields=("comm_overlap.overlap_grad_reduce", "model.gradient_accumulation_fusion"),
        applies=lambda cfg, ctx: (
            dw_te(cfg, ctx) and (cfg.comm_overlap.overlap_grad_reduce or cfg.model.gradient_accumulation_fusion)
        ),
        holds=lambda cfg, ctx: te_at_least(ctx, "2.7"),
        message="delayed wgrad with overlapped grad reduce or gradient-accumulation fusion needs TE >= 2.7",
        fix="upgrade Transformer Engine to >= 2.7, set comm_overlap.overlap_grad_reduce=false and "
        "model.gradient_accumulation_fusion=false, " + _DW_FIX_OFF,
        extra_values=_TE,
    ),
    Rule(
        id="delay-wgrad-te-cuda-graph-te-2.10",
        group="delay-wgrad",
        fields=("model.cuda_graph_impl",),
        applies=lambda cfg, ctx: dw_te(cfg, ctx) and cfg.model.cuda_graph_impl == "transformer_engine",
        holds=lambda cfg, ctx: te_at_least(ctx, "2.10"),
        message="delayed wgrad with Transformer Engine CUDA graphs needs TE >= 2.10 (megatron-core rule)",
        fix="upgrade Transformer Engine to >= 2.10, set model.cuda_graph_impl=none, " + _DW_FIX_OFF,
        extra_values=_TE,
    ),
    Rule(
        id="delay-wgrad-graph-scope-te-2.12",
        group="delay-wgrad",
        fields=("model.cuda_graph_impl", "model.cuda_graph_modules"),
        applies=dw_graph,
        holds=lambda cfg, ctx: te_at_least(ctx, "2.12"),
        message="delayed wgrad inside a CUDA-graph scope (attn/whole layer, or moe_router with a "
        "non-overlapped shared expert) needs TE >= 2.12",
        fix="upgrade Transformer Engine to >= 2.12, capture only moe_router/moe_preprocess, " + _DW_FIX_OFF,
        extra_values=_TE,
    ),
    Rule(
        id="delay-wgrad-graph-scope-needs-grad-accum-fusion",
        group="delay-wgrad",
        fields=("model.gradient_accumulation_fusion", "model.cuda_graph_modules"),
        applies=dw_graph,
        holds=lambda cfg, ctx: bool(cfg.model.gradient_accumulation_fusion),
        message="delayed wgrad inside a CUDA-graph scope needs gradient-accumulation fusion",
        fix="set model.gradient_accumulation_fusion=true, or keep attention out of the graph scope",
    ),
    Rule(
        id="delay-wgrad-graph-scope-no-attention-bias",
        group="delay-wgrad",
        fields=("model.add_bias_linear", "model.add_qkv_bias", "model.cuda_graph_modules"),
        applies=dw_graph,
        holds=lambda cfg, ctx: not cfg.model.add_bias_linear and not cfg.model.add_qkv_bias,
        message="delayed wgrad inside a CUDA-graph scope does not support attention bias",
        fix="set model.add_bias_linear=false and model.add_qkv_bias=false, or keep attention out of the graph scope",
    ),
)

TE_CUDA_GRAPH_OVERLAP_RULES: tuple[Rule, ...] = (
    Rule(
        id="te-cuda-graph-needs-te",
        group="cuda-graph",
        fields=("model.cuda_graph_impl",),
        applies=lambda cfg, ctx: cfg.model.cuda_graph_impl == "transformer_engine",
        holds=lambda cfg, ctx: ctx.te_version is not None,
        message="Transformer Engine CUDA graphs need Transformer Engine",
        fix="set model.cuda_graph_impl=none (--cuda_graph_impl none) or install the 'te' extra",
        extra_values=_TE,
    ),
)

SHARED_EXPERT_RULES: tuple[Rule, ...] = (
    Rule(
        id="shared-expert-overlap-needs-alltoall-or-flex",
        group="shared-expert",
        fields=("model.moe_shared_expert_overlap", "model.moe_token_dispatcher_type"),
        applies=lambda cfg, ctx: bool(cfg.model.moe_shared_expert_overlap),
        holds=lambda cfg, ctx: cfg.model.moe_token_dispatcher_type in ("alltoall", "flex"),
        message="shared-expert overlap only works with the alltoall or flex dispatcher",
        fix="set model.moe_token_dispatcher_type=alltoall, or model.moe_shared_expert_overlap=false",
    ),
    Rule(
        id="shared-expert-overlap-needs-shared-expert",
        group="shared-expert",
        severity="warning",
        fields=("model.moe_shared_expert_overlap", "model.moe_shared_expert_intermediate_size"),
        applies=lambda cfg, ctx: bool(cfg.model.moe_shared_expert_overlap),
        holds=lambda cfg, ctx: has_shared_expert(cfg),
        message="shared-expert overlap does nothing: the model has no shared expert",
        fix="set model.moe_shared_expert_overlap=false",
    ),
)

_TP_ON = _co("tp_comm_overlap")

TP_OVERLAP_RULES: tuple[Rule, ...] = (
    Rule(
        id="tp-overlap-needs-tp",
        group="tp-overlap",
        fields=("comm_overlap.tp_comm_overlap", "model.tensor_model_parallel_size"),
        applies=_TP_ON,
        holds=lambda cfg, ctx: cfg.model.tensor_model_parallel_size >= 2,
        message="TP comm overlap needs tensor parallelism (refused, not silently switched off)",
        fix="set model.tensor_model_parallel_size >= 2, or comm_overlap.tp_comm_overlap=false",
    ),
    Rule(
        id="tp-overlap-needs-sequence-parallel",
        group="tp-overlap",
        fields=("comm_overlap.tp_comm_overlap", "model.sequence_parallel"),
        applies=_TP_ON,
        holds=lambda cfg, ctx: bool(cfg.model.sequence_parallel),
        message="TP comm overlap needs sequence parallelism",
        fix="set model.sequence_parallel=true, or comm_overlap.tp_comm_overlap=false",
    ),
    Rule(
        id="tp-overlap-needs-te",
        group="tp-overlap",
        fields=("comm_overlap.tp_comm_overlap", "model.layer_spec"),
        applies=_TP_ON,
        holds=layers_use_te,
        message="TP comm overlap is implemented by Transformer Engine layers (userbuffers)",
        fix="install the 'te' extra and use layer_spec auto/transformer_engine, or comm_overlap.tp_comm_overlap=false",
        extra_values=_TE,
    ),
    Rule(
        id="tp-overlap-userbuffers-not-initialised",
        group="tp-overlap",
        fields=("comm_overlap.tp_comm_overlap",),
        applies=_TP_ON,
        holds=lambda cfg, ctx: False,
        message="TP comm overlap needs Transformer Engine's userbuffers initialised before the model is "
        "built, which this package does not do: with Transformer Engine the layers would fail or run "
        "without overlap (refused, not silently ignored)",
        fix="set comm_overlap.tp_comm_overlap=false; overlap tensor-parallel communication is not "
        "available here (the MoE expert-parallel and data-parallel overlaps are)",
        extra_values=_TE,
    ),
    Rule(
        id="tp-overlap-cfg-needs-tp-overlap",
        group="tp-overlap",
        fields=("comm_overlap.tp_comm_overlap_cfg", "comm_overlap.tp_comm_overlap"),
        applies=lambda cfg, ctx: cfg.comm_overlap.tp_comm_overlap_cfg is not None,
        holds=lambda cfg, ctx: bool(cfg.comm_overlap.tp_comm_overlap),
        message="tp_comm_overlap_cfg configures the TP-overlap userbuffers only: without TP comm "
        "overlap it would do nothing",
        fix="set comm_overlap.tp_comm_overlap_cfg=null",
    ),
    Rule(
        id="tp-comm-bootstrap-backend-known",
        group="tp-overlap",
        fields=("comm_overlap.tp_comm_bootstrap_backend",),
        holds=lambda cfg, ctx: cfg.comm_overlap.tp_comm_bootstrap_backend in (None, "nccl", "mpi", "gloo"),
        message="unknown bootstrap backend for the TP-overlap userbuffers",
        fix="set comm_overlap.tp_comm_bootstrap_backend to nccl, mpi or gloo (or null)",
    ),
)

_P2P_ON = _co("overlap_p2p_comm")
_DEFER_EMBEDDING_ON = _co("defer_embedding_wgrad_compute")


def _dp_overlap_on(cfg, ctx) -> bool:
    return bool(cfg.comm_overlap.overlap_grad_reduce or cfg.comm_overlap.overlap_param_gather)


def _layout_dp(cfg, ctx):
    return data_parallel_size(cfg, ctx.world_size) if ctx.world_size is not None else None


PIPELINE_DP_RULES: tuple[Rule, ...] = (
    Rule(
        id="data-parallel-size-matches-layout",
        group="data-parallel",
        fields=("comm_overlap.data_parallel_size",),
        applies=lambda cfg, ctx: cfg.comm_overlap.data_parallel_size is not None,
        holds=lambda cfg, ctx: (
            isinstance(cfg.comm_overlap.data_parallel_size, int)
            and cfg.comm_overlap.data_parallel_size >= 1
            and (ctx.world_size is None or cfg.comm_overlap.data_parallel_size == _layout_dp(cfg, ctx))
        ),
        message="comm_overlap.data_parallel_size must be a positive integer and, with a world size, the "
        "data-parallel size of the layout (world size / (TP x PP x CP)): the overlap defaults are "
        "decided for it",
        fix="give comm_overlap.data_parallel_size the layout's data-parallel size, or null (derived)",
        extra_values=(("world_size", lambda ctx: ctx.world_size),),
        derived_values=(("layout data-parallel size", _layout_dp),),
    ),
    Rule(
        id="p2p-overlap-needs-interleaved-pipeline",
        group="pipeline",
        fields=(
            "comm_overlap.overlap_p2p_comm",
            "model.pipeline_model_parallel_size",
            "model.virtual_pipeline_model_parallel_size",
        ),
        applies=_P2P_ON,
        holds=lambda cfg, ctx: (
            cfg.model.pipeline_model_parallel_size > 1 and cfg.model.virtual_pipeline_model_parallel_size is not None
        ),
        message="p2p overlap exists only in the interleaved pipeline schedule (PP>1 with VPP)",
        fix="set model.virtual_pipeline_model_parallel_size, or leave comm_overlap.overlap_p2p_comm unset",
    ),
    Rule(
        id="p2p-overlap-excludes-batch-p2p",
        group="pipeline",
        fields=("comm_overlap.overlap_p2p_comm", "comm_overlap.batch_p2p_comm"),
        applies=_P2P_ON,
        holds=lambda cfg, ctx: not cfg.comm_overlap.batch_p2p_comm,
        message="overlapped and batched p2p are mutually exclusive",
        fix="set one of comm_overlap.overlap_p2p_comm / batch_p2p_comm to false (or leave both unset)",
    ),
    Rule(
        id="param-gather-overlap-needs-distributed-optimizer",
        group="data-parallel",
        fields=("comm_overlap.overlap_param_gather", "ddp.use_distributed_optimizer"),
        applies=_co("overlap_param_gather"),
        holds=lambda cfg, ctx: bool(cfg.ddp.use_distributed_optimizer),
        message="param-gather overlap is a distributed-optimizer feature",
        fix="set ddp.use_distributed_optimizer=true (and optimizer.use_distributed_optimizer), or "
        "comm_overlap.overlap_param_gather=false",
    ),
    Rule(
        id="dp-overlap-needs-nccl-on-gpus",
        group="data-parallel",
        fields=(
            "comm_overlap.overlap_grad_reduce",
            "comm_overlap.overlap_param_gather",
            "dist.distributed_backend",
        ),
        applies=lambda cfg, ctx: gloo_on_cuda(cfg),
        holds=lambda cfg, ctx: not _dp_overlap_on(cfg, ctx),
        message="gloo cannot coalesce collectives on CUDA tensors, so megatron's DP collectives run "
        "one by one, synchronously: overlapped grad reduce / param gather cannot be honoured",
        fix="set comm_overlap.overlap_grad_reduce=false and comm_overlap.overlap_param_gather=false, "
        "or run one rank per GPU over NCCL",
    ),
    Rule(
        id="param-gather-with-step-needs-param-gather-overlap",
        group="data-parallel",
        fields=("comm_overlap.overlap_param_gather_with_optimizer_step", "comm_overlap.overlap_param_gather"),
        applies=_co("overlap_param_gather_with_optimizer_step"),
        holds=_co("overlap_param_gather"),
        message="overlapping the param gather with the optimizer step needs param-gather overlap",
        fix="set comm_overlap.overlap_param_gather=true, or overlap_param_gather_with_optimizer_step=false",
    ),
    Rule(
        id="defer-embedding-wgrad-needs-pipeline",
        group="pipeline",
        fields=("comm_overlap.defer_embedding_wgrad_compute", "model.pipeline_model_parallel_size"),
        applies=_DEFER_EMBEDDING_ON,
        holds=lambda cfg, ctx: cfg.model.pipeline_model_parallel_size > 1,
        message="embedding wgrad is deferred to the pipeline flush; there is none with PP=1",
        fix="set comm_overlap.defer_embedding_wgrad_compute=false, or use pipeline parallelism",
    ),
    Rule(
        id="defer-embedding-wgrad-needs-grad-accum-fusion",
        group="pipeline",
        fields=("comm_overlap.defer_embedding_wgrad_compute", "model.gradient_accumulation_fusion"),
        applies=_DEFER_EMBEDDING_ON,
        holds=lambda cfg, ctx: bool(cfg.model.gradient_accumulation_fusion),
        message="deferred embedding wgrad needs gradient-accumulation fusion",
        fix="set model.gradient_accumulation_fusion=true, or comm_overlap.defer_embedding_wgrad_compute=false",
    ),
)


def _switch_type_rule(name: str) -> Rule:
    key = f"comm_overlap.{name}"
    return Rule(
        id=f"overlap-switch-is-bool:{name}",
        group="types",
        fields=(key,),
        holds=lambda cfg, ctx: (
            getattr(cfg.comm_overlap, name) is None or isinstance(getattr(cfg.comm_overlap, name), bool)
        ),
        message="overlap switches take true/false/null (a 1 or 'yes' would skip the checks)",
        fix=f"set {key}=true, false or null",
    )


TYPE_RULES: tuple[Rule, ...] = tuple(_switch_type_rule(name) for name in BOOL_SWITCHES)

OVERLAP_RULES: tuple[Rule, ...] = (
    TYPE_RULES
    + EP_OVERLAP_RULES
    + EP_OVERLAP_SCHEDULE_RULES
    + DELAY_WGRAD_RULES
    + TE_CUDA_GRAPH_OVERLAP_RULES
    + SHARED_EXPERT_RULES
    + TP_OVERLAP_RULES
    + PIPELINE_DP_RULES
    + FLEX_RULES
    + FLEX_SETTING_RULES
    + ACTIVATION_MEMORY_RULES
)
"""Every overlap prerequisite, in the order they are reported and documented."""

NO_EFFECT_RULE_IDS: frozenset[str] = frozenset({"shared-expert-overlap-needs-shared-expert"})
"""Warnings that mean the switch they name does nothing in this run: the start-up overlap report
lists the feature under ``no effect`` with the warning, never as active. (The other warnings are
notes on a feature that runs.)"""
