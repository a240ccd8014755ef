"""General (non-overlap) rules of a run, as data. The overlap rules live in ``comm_overlap``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from megatron.bridge.models.gpt_provider import CROSS_ENTROPY_IMPLS
from megatron.bridge.models.layer_specs import LAYER_SPEC_CHOICES
from megatron.bridge.training.mixed_precision import MIXED_PRECISION_RECIPES
from megatron.bridge.training.rules import TE_VERSION_VALUE, Rule, RuleContext

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer


def model_parallel_size(cfg: "ConfigContainer") -> int:
    """GPUs one model replica spans (TP x PP x CP)."""
    m = cfg.model
    return m.tensor_model_parallel_size * m.pipeline_model_parallel_size * m.context_parallel_size


def expert_parallel_span(cfg: "ConfigContainer") -> int:
    """GPUs one expert replica spans (expert TP x EP x PP)."""
    m = cfg.model
    etp = m.expert_tensor_parallel_size or m.tensor_model_parallel_size
    return etp * m.expert_model_parallel_size * m.pipeline_model_parallel_size


def data_parallel_size(cfg: "ConfigContainer", world_size: int) -> Optional[int]:
    """Data-parallel size for ``world_size`` GPUs, ``None`` when the layout does not divide it."""
    span = model_parallel_size(cfg)
    return world_size // span if world_size % span == 0 else None


def pipeline_split_layers(cfg: "ConfigContainer") -> int:
    """Layers the pipeline split counts: decoder layers plus embedding/loss stages when accounted."""
    m = cfg.model
    return (
        m.num_layers
        + int(m.account_for_embedding_in_pipeline_split)
        + int(m.account_for_loss_in_pipeline_split)
    )


def lr_decay_iters(cfg: "ConfigContainer") -> int:
    """Iterations the learning rate decays over (``train.train_iters`` when not set)."""
    return cfg.scheduler.lr_decay_iters or cfg.train.train_iters


def _world(ctx: RuleContext) -> Optional[int]:
    return ctx.world_size


def _has_world(cfg: "ConfigContainer", ctx: RuleContext) -> bool:
    return ctx.world_size is not None


def _precision(cfg: "ConfigContainer"):
    return MIXED_PRECISION_RECIPES.get(cfg.mixed_precision)


def _window_ok(cfg: "ConfigContainer", ctx: RuleContext) -> bool:
    w = cfg.logger.steady_state_window
    return len(w) == 2 and all(isinstance(i, int) for i in w) and 1 <= w[0] <= w[1]


def _is_moe(cfg: "ConfigContainer", ctx: RuleContext) -> bool:
    return bool(cfg.model.num_moe_experts)


GENERAL_RULES: tuple[Rule, ...] = (
    Rule(
        id="mixed-precision-known",
        fields=("mixed_precision",),
        holds=lambda cfg, ctx: cfg.mixed_precision in MIXED_PRECISION_RECIPES,
        message="unknown mixed-precision recipe",
        fix=f"use one of {sorted(MIXED_PRECISION_RECIPES)}",
    ),
    Rule(
        id="fp8-needs-transformer-engine",
        fields=("mixed_precision",),
        applies=lambda cfg, ctx: (p := _precision(cfg)) is not None and p.needs_transformer_engine,
        holds=lambda cfg, ctx: ctx.te_version is not None,
        message="FP8 compute needs Transformer Engine, which does not import here",
        fix="use mixed_precision=bf16_mixed (-c bf16), or install the 'te' extra on the GPU machine",
        extra_values=TE_VERSION_VALUE,
    ),
    Rule(
        id="layer-spec-known",
        fields=("model.layer_spec",),
        holds=lambda cfg, ctx: cfg.model.layer_spec in LAYER_SPEC_CHOICES,
        message="unknown layer implementation",
        fix=f"use one of {list(LAYER_SPEC_CHOICES)}",
    ),
    Rule(
        id="te-layer-spec-needs-transformer-engine",
        fields=("model.layer_spec",),
        applies=lambda cfg, ctx: cfg.model.layer_spec == "transformer_engine",
        holds=lambda cfg, ctx: ctx.te_version is not None,
        message="the Transformer Engine layer spec was requested but TE does not import",
        fix="set model.layer_spec=auto (torch-native/local modules) or install the 'te' extra",
        extra_values=TE_VERSION_VALUE,
    ),
    Rule(
        id="cross-entropy-impl-known",
        fields=("model.cross_entropy_fusion_impl",),
        holds=lambda cfg, ctx: cfg.model.cross_entropy_fusion_impl in CROSS_ENTROPY_IMPLS,
        message="unknown fused cross-entropy implementation",
        fix=f"use one of {list(CROSS_ENTROPY_IMPLS)}",
    ),
    Rule(
        id="te-cross-entropy-needs-transformer-engine",
        fields=("model.cross_entropy_loss_fusion", "model.cross_entropy_fusion_impl"),
        applies=lambda cfg, ctx: cfg.model.cross_entropy_loss_fusion
        and cfg.model.cross_entropy_fusion_impl == "te",
        holds=lambda cfg, ctx: ctx.te_version is not None,
        message="Transformer Engine's fused cross-entropy was requested but TE does not import",
        fix="set model.cross_entropy_fusion_impl=torch_native (streaming Triton/PyTorch loss, any "
        "machine) or install the 'te' extra",
        extra_values=TE_VERSION_VALUE,
    ),
    Rule(
        id="train-iters-positive",
        fields=("train.train_iters",),
        holds=lambda cfg, ctx: cfg.train.train_iters >= 1,
        message="training needs at least one iteration",
        fix="set train.train_iters (or --max_steps) to 1 or more",
    ),
    Rule(
        id="lr-warmup-shorter-than-decay",
        fields=("scheduler.lr_warmup_iters", "scheduler.lr_decay_iters", "train.train_iters"),
        holds=lambda cfg, ctx: 0 <= cfg.scheduler.lr_warmup_iters < lr_decay_iters(cfg),
        message="the learning-rate warm-up must end before the decay does (megatron-core's "
        "scheduler asserts it); lr_decay_iters=null decays over train.train_iters",
        fix="lower scheduler.lr_warmup_iters or set scheduler.lr_decay_iters above it",
    ),
    Rule(
        id="micro-batch-divides-global-batch",
        fields=("train.global_batch_size", "train.micro_batch_size"),
        holds=lambda cfg, ctx: cfg.train.micro_batch_size >= 1
        and cfg.train.global_batch_size >= cfg.train.micro_batch_size
        and cfg.train.global_batch_size % cfg.train.micro_batch_size == 0,
        message="the global batch must be a positive multiple of the micro batch",
        fix="choose train.global_batch_size as a multiple of train.micro_batch_size",
    ),
    Rule(
        id="layout-divides-world-size",
        fields=(
            "model.tensor_model_parallel_size",
            "model.pipeline_model_parallel_size",
            "model.context_parallel_size",
        ),
        applies=_has_world,
        holds=lambda cfg, ctx: ctx.world_size % model_parallel_size(cfg) == 0,
        message="TP x PP x CP must divide the number of GPUs",
        fix="change the parallel sizes or the GPU count so that TP*PP*CP divides it",
        extra_values=(("world_size", _world),),
    ),
    Rule(
        id="expert-layout-divides-world-size",
        fields=(
            "model.expert_model_parallel_size",
            "model.expert_tensor_parallel_size",
            "model.pipeline_model_parallel_size",
        ),
        applies=_has_world,
        holds=lambda cfg, ctx: ctx.world_size % expert_parallel_span(cfg) == 0,
        message="expert TP x EP x PP must divide the number of GPUs",
        fix="change expert_model_parallel_size (or the GPU count) so that ETP*EP*PP divides it",
        extra_values=(("world_size", _world),),
    ),
    Rule(
        id="data-parallel-divides-global-batch",
        fields=("train.global_batch_size", "train.micro_batch_size"),
        applies=lambda cfg, ctx: ctx.world_size is not None
        and data_parallel_size(cfg, ctx.world_size) is not None
        and cfg.train.micro_batch_size >= 1,
        holds=lambda cfg, ctx: cfg.train.global_batch_size
        % (cfg.train.micro_batch_size * data_parallel_size(cfg, ctx.world_size))
        == 0,
        message="the global batch must be a multiple of micro batch x data-parallel size",
        fix="scale train.global_batch_size to a multiple of micro_batch_size * DP",
        extra_values=(("world_size", _world),),
    ),
    Rule(
        id="experts-divisible-by-ep",
        fields=("model.num_moe_experts", "model.expert_model_parallel_size"),
        applies=_is_moe,
        holds=lambda cfg, ctx: cfg.model.num_moe_experts % cfg.model.expert_model_parallel_size == 0,
        message="each expert-parallel rank must hold the same number of experts",
        fix="choose expert_model_parallel_size as a divisor of num_moe_experts",
    ),
    Rule(
        id="ep-needs-moe",
        fields=("model.expert_model_parallel_size", "model.num_moe_experts"),
        applies=lambda cfg, ctx: cfg.model.expert_model_parallel_size > 1,
        holds=lambda cfg, ctx: bool(cfg.model.num_moe_experts),
        message="expert parallelism needs an MoE model",
        fix="set model.num_moe_experts or expert_model_parallel_size=1",
    ),
    Rule(
        id="sequence-parallel-needs-tp",
        fields=("model.sequence_parallel", "model.tensor_model_parallel_size"),
        applies=lambda cfg, ctx: cfg.model.sequence_parallel,
        holds=lambda cfg, ctx: cfg.model.tensor_model_parallel_size > 1,
        message="sequence parallelism splits along the tensor-parallel group and needs TP > 1",
        fix="set model.sequence_parallel=false or tensor_model_parallel_size >= 2",
    ),
    Rule(
        id="layers-divisible-by-pipeline",
        fields=(
            "model.num_layers",
            "model.pipeline_model_parallel_size",
            "model.virtual_pipeline_model_parallel_size",
        ),
        applies=lambda cfg, ctx: cfg.model.pipeline_model_parallel_size > 1
        and cfg.model.pipeline_model_parallel_layout is None
        and cfg.model.num_layers_in_first_pipeline_stage is None
        and cfg.model.num_layers_in_last_pipeline_stage is None,
        holds=lambda cfg, ctx: pipeline_split_layers(cfg)
        % (cfg.model.pipeline_model_parallel_size * (cfg.model.virtual_pipeline_model_parallel_size or 1))
        == 0,
        message="layers must split evenly over pipeline (and virtual pipeline) stages",
        fix="choose num_layers (plus one per account_for_{embedding,loss}_in_pipeline_split) as a "
        "multiple of PP * VPP",
    ),
    Rule(
        id="vocab-size-set",
        fields=("model.vocab_size",),
        holds=lambda cfg, ctx: cfg.model.vocab_size is not None and cfg.model.vocab_size > 0,
        message="the model needs a vocabulary size",
        fix="set model.vocab_size (e.g. 151936 for Qwen3)",
    ),
    Rule(
        id="hf-tokenizer-needs-model",
        fields=("tokenizer.tokenizer_type", "tokenizer.tokenizer_model"),
        applies=lambda cfg, ctx: cfg.tokenizer.tokenizer_type == "HuggingFaceTokenizer",
        holds=lambda cfg, ctx: bool(cfg.tokenizer.tokenizer_model),
        message="a Hugging Face tokenizer needs a local path or name",
        fix="set tokenizer.tokenizer_model, or use tokenizer.tokenizer_type=NullTokenizer",
    ),
    Rule(
        id="steady-state-window",
        fields=("logger.steady_state_window",),
        holds=_window_ok,
        message="the steady-state window is two 1-based iterations, first <= last",
        fix="e.g. logger.steady_state_window=[3,8]",
    ),
    Rule(
        id="cpu-mode-needs-gloo",
        fields=("dist.device", "dist.distributed_backend"),
        applies=lambda cfg, ctx: cfg.dist.device == "cpu",
        holds=lambda cfg, ctx: cfg.dist.effective_backend == "gloo",
        message="CPU smoke mode runs collectives over gloo; NCCL needs GPUs",
        fix="set dist.distributed_backend=gloo (or leave it null)",
    ),
    Rule(
        id="save-interval-needs-save-dir",
        fields=("checkpoint.save_interval", "checkpoint.save"),
        applies=lambda cfg, ctx: cfg.checkpoint.save_interval is not None,
        holds=lambda cfg, ctx: bool(cfg.checkpoint.save) and cfg.checkpoint.save_interval >= 1,
        message="periodic checkpoints need a directory and a positive interval",
        fix="set checkpoint.save=/path/to/ckpt and checkpoint.save_interval >= 1",
    ),
    Rule(
        id="profile-steps-ordered",
        fields=("profiling.profile_step_start", "profiling.profile_step_end"),
        applies=lambda cfg, ctx: cfg.profiling.use_pytorch_profiler,
        holds=lambda cfg, ctx: 1 <= cfg.profiling.profile_step_start <= cfg.profiling.profile_step_end,
        message="profiling captures steps start..end (1-based), start <= end",
        fix="e.g. profiling.profile_step_start=5 profiling.profile_step_end=6",
    ),
)
