"""General (non-overlap) rules of a run, as data. The overlap rules live in ``overlap.overlap_rules``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from megatron.bridge.models.gpt_provider import CROSS_ENTROPY_IMPLS
from megatron.bridge.models.layer_specs import LAYER_SPEC_CHOICES
from megatron.bridge.training.config_stages.facts.data_files import missing_data_files
from megatron.bridge.training.config_stages.facts.gpu_catalog import capability_at_least
from megatron.bridge.training.config_stages.facts.mixed_precision_targets import mixed_precision_recipe
from megatron.bridge.training.config_stages.facts.overlap_facts import precision_fp8, resolved_layer_spec
from megatron.bridge.training.config_stages.facts.parallel_layout import (
    all_within,
    dp_known,
    expert_parallel_span,
    known_data_parallel_size,
    layout_within,
    lr_decay_iters,
    micro_batches_per_step,
    model_parallel_size,
    pipeline_split_layers,
)
from megatron.bridge.training.config_stages.rules.checkpoint_rules import CHECKPOINT_RULES
from megatron.bridge.training.config_stages.rules.mixed_precision_rules import PRECISION_RULES
from megatron.bridge.training.config_stages.schema.field_ranges import RANGE_RULES
from megatron.bridge.training.config_stages.schema.mixed_precision_config import (
    MIXED_PRECISION_RECIPES,
    is_known_setting,
)
from megatron.bridge.training.config_stages.schema.rule_base import TE_VERSION_VALUE, Rule, RuleContext, read_field
from megatron.bridge.training.telemetry.steady_window import automatic_window

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer


def _world(ctx: RuleContext) -> int | None:
    return ctx.world_size


def _has_world(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return ctx.world_size is not None


def _uses_fp8(cfg: ConfigContainer) -> bool:
    """FP8 from the precision recipe, or with ``mixed_precision=null`` from ``model.fp8``."""
    return precision_fp8(cfg) is not None


def _fp8_recipe(cfg: ConfigContainer) -> str | None:
    """The FP8 scaling recipe the run computes with (``None`` without FP8)."""
    if not _uses_fp8(cfg):
        return None
    if cfg.mixed_precision is None:
        return cfg.model.fp8_recipe
    recipe = mixed_precision_recipe(cfg.mixed_precision)
    return recipe.fp8_recipe if recipe is not None else None  # an unknown name: its own rule says so


MXFP8_MIN_CAPABILITY = (10, 0)
"""MXFP8 (block-scaled FP8) runs on Blackwell's tensor cores; Hopper has no such mode."""


def _window_ok(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    w = cfg.logger.steady_state_window
    return w is not None and len(w) == 2 and all(isinstance(i, int) for i in w) and 1 <= w[0] <= w[1]


def _parks_after_window(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    """Every parked step lies within the run and after the window: a set window's last step, or
    the automatic window's warm-up with at least one steady step before the first park."""
    parks, iters = cfg.profiling.gpu_park_steps, cfg.train.train_iters
    window: Sequence[int] | None = cfg.logger.steady_state_window
    if window is None:
        window = automatic_window(iters, first_parked_step=min(parks))
        if window is None:
            return False
    return all(window[-1] < s <= iters for s in parks)


def _divides(part: int | None, whole: int | None) -> bool:
    """``part`` divides ``whole``; unknown sizes refuse nothing (the rules apply only where both are known)."""
    return part is None or whole is None or whole % part == 0


def _batch_divides_over_data_parallel(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    dp = known_data_parallel_size(cfg, ctx)
    return dp is None or cfg.train.global_batch_size % (cfg.train.micro_batch_size * dp) == 0


def _tokenizer_vocab_fits(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    tokens, rows = cfg.tokenizer.vocab_size, cfg.model.vocab_size
    return tokens is None or rows is None or tokens <= rows


def _whole(value: object) -> bool:
    """An ``int`` (not a ``bool``): a size a comparison can use (others are the range rules' to report)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_moe(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return bool(cfg.model.num_moe_experts)


CONFIG_RULES: tuple[Rule, ...] = (
    Rule(
        id="mixed-precision-known",
        fields=("mixed_precision",),
        holds=lambda cfg, ctx: is_known_setting(cfg.mixed_precision),
        message="Unknown mixed-precision recipe",
        fix=f"use one of {sorted(MIXED_PRECISION_RECIPES)}, a MixedPrecisionConfig, or null (no recipe: "
        "the dtype flags of model, optimizer and DDP stand as set)",
    ),
    Rule(
        id="fp8-needs-transformer-engine",
        fields=("mixed_precision", "model.fp8"),
        applies=lambda cfg, ctx: _uses_fp8(cfg),
        holds=lambda cfg, ctx: ctx.te_version is not None,
        message="FP8 compute needs Transformer Engine, which does not import here",
        fix="use mixed_precision=bf16_mixed (-c bf16), or install the 'te' extra on the GPU machine",
        extra_values=TE_VERSION_VALUE,
    ),
    Rule(
        id="fp8-needs-te-layers",
        fields=("mixed_precision", "model.fp8", "model.layer_spec"),
        # without TE, fp8-needs-transformer-engine says it all unless the layers were chosen by name
        applies=lambda cfg, ctx: (
            _uses_fp8(cfg) and (ctx.te_version is not None or cfg.model.layer_spec in ("local", "torch_native"))
        ),
        holds=lambda cfg, ctx: resolved_layer_spec(cfg, ctx) == "transformer_engine",
        message="FP8 compute happens inside Transformer Engine's layers; megatron-core's local and the "
        "torch-native layers would compute in bf16 and the FP8 setting would have no effect",
        fix="set model.layer_spec=auto or transformer_engine (auto picks TE for FP8), or use "
        "mixed_precision=bf16_mixed (-c bf16)",
    ),
    Rule(
        id="mxfp8-needs-blackwell",
        fields=("mixed_precision", "model.fp8_recipe"),
        applies=lambda cfg, ctx: _fp8_recipe(cfg) == "mxfp8" and ctx.device_capability is not None,
        holds=lambda cfg, ctx: capability_at_least(ctx.device_capability, MXFP8_MIN_CAPABILITY),
        message="MXFP8 (block-scaled FP8) needs Blackwell tensor cores (compute capability 10.0+); "
        "Transformer Engine refuses it on this GPU when the first layer runs",
        fix="use mixed_precision=bf16_with_fp8_current_scaling_mixed or bf16_with_fp8_delayed_scaling_mixed "
        "(-c fp8_cs / fp8_ds) on Hopper, or validate for a Blackwell GPU (-g b200)",
        derived_values=(("target_gpu_capability", lambda cfg, ctx: ctx.device_capability),),
    ),
    Rule(
        id="own-precision-flags-agree",
        fields=(
            "model.bf16",
            "model.fp16",
            "model.params_dtype",
            "optimizer.bf16",
            "optimizer.fp16",
            "optimizer.params_dtype",
        ),
        applies=lambda cfg, ctx: cfg.mixed_precision is None,
        holds=lambda cfg, ctx: all(
            read_field(cfg, f"model.{name}") == read_field(cfg, f"optimizer.{name}")
            for name in ("bf16", "fp16", "params_dtype")
        ),
        message="with mixed_precision=null the dtype flags are yours, and model and optimizer must agree: "
        "megatron-core wraps the model from model.bf16/fp16 but builds the optimizer (with or without "
        "fp32 main weights) from optimizer.bf16/fp16/params_dtype",
        fix="give optimizer.bf16, optimizer.fp16 and optimizer.params_dtype the model's values, or "
        "choose a precision recipe (mixed_precision=bf16_mixed, -c bf16)",
    ),
    Rule(
        id="dataset-files-exist",
        fields=("dataset.data_paths",),
        applies=lambda cfg, ctx: not cfg.dataset.is_mock,
        holds=lambda cfg, ctx: not missing_data_files(cfg.dataset.data_paths),
        message="the indexed dataset is not there: every prefix needs its .bin and .idx file (a run "
        "never falls back to mock data)",
        fix="give dataset.data_path / dataset.data_paths the prefix of existing files (without "
        ".bin/.idx), or leave them null for mock data",
        derived_values=(("missing", lambda cfg, ctx: missing_data_files(cfg.dataset.data_paths)),),
    ),
    Rule(
        id="hf-tokenizer-kwargs-need-hf-tokenizer",
        fields=("tokenizer.hf_tokenizer_kwargs", "tokenizer.tokenizer_type"),
        applies=lambda cfg, ctx: bool(cfg.tokenizer.hf_tokenizer_kwargs),
        holds=lambda cfg, ctx: cfg.tokenizer.tokenizer_type == "HuggingFaceTokenizer",
        message="hf_tokenizer_kwargs are only passed to a Hugging Face tokenizer: here they would do nothing",
        fix="set tokenizer.tokenizer_type=HuggingFaceTokenizer, or tokenizer.hf_tokenizer_kwargs=null",
    ),
    Rule(
        id="te-rng-tracker-needs-transformer-engine",
        fields=("rng.te_rng_tracker",),
        applies=lambda cfg, ctx: bool(cfg.rng.te_rng_tracker),
        holds=lambda cfg, ctx: ctx.te_version is not None and cfg.dist.device == "cuda",
        message="Transformer Engine's RNG tracker needs Transformer Engine on GPUs",
        fix="set rng.te_rng_tracker=false, or install the 'te' extra on the GPU machine",
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
        applies=lambda cfg, ctx: cfg.model.cross_entropy_loss_fusion and cfg.model.cross_entropy_fusion_impl == "te",
        holds=lambda cfg, ctx: ctx.te_version is not None,
        message="Transformer Engine's fused cross-entropy was requested but TE does not import",
        fix="set model.cross_entropy_fusion_impl=torch_native (streaming Triton/PyTorch loss, any "
        "machine) or install the 'te' extra",
        extra_values=TE_VERSION_VALUE,
    ),
    Rule(
        id="te-cross-entropy-stability",
        fields=("model.cross_entropy_loss_fusion", "model.cross_entropy_fusion_impl"),
        applies=lambda cfg, ctx: cfg.model.cross_entropy_loss_fusion and ctx.te_version is not None,
        holds=lambda cfg, ctx: cfg.model.cross_entropy_fusion_impl != "te",
        message="megatron-core warns that Transformer Engine's fused cross-entropy has known stability "
        "issues (Megatron-LM's own argument check refuses it); accepted, since it trains, but watch the loss",
        fix="use model.cross_entropy_fusion_impl=torch_native (the Qwen3-MoE recipes' default) or native",
        severity="warning",
    ),
    Rule(
        id="lr-warmup-shorter-than-decay",
        fields=("scheduler.lr_warmup_iters", "scheduler.lr_decay_iters", "train.train_iters"),
        applies=lambda cfg, ctx: all_within(
            cfg, ctx, "scheduler.lr_warmup_iters", "scheduler.lr_decay_iters", "train.train_iters"
        ),
        holds=lambda cfg, ctx: 0 <= cfg.scheduler.lr_warmup_iters < lr_decay_iters(cfg),
        message="the learning-rate warm-up must end before the decay does (megatron-core's "
        "scheduler asserts it); lr_decay_iters=null decays over train.train_iters",
        fix="lower scheduler.lr_warmup_iters or set scheduler.lr_decay_iters above it",
    ),
    Rule(
        id="micro-batch-divides-global-batch",
        fields=("train.global_batch_size", "train.micro_batch_size"),
        applies=lambda cfg, ctx: all_within(cfg, ctx, "train.global_batch_size", "train.micro_batch_size"),
        holds=lambda cfg, ctx: (
            cfg.train.global_batch_size >= cfg.train.micro_batch_size
            and cfg.train.global_batch_size % cfg.train.micro_batch_size == 0
        ),
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
        applies=lambda cfg, ctx: _has_world(cfg, ctx) and layout_within(cfg, ctx),
        holds=lambda cfg, ctx: _divides(model_parallel_size(cfg), ctx.world_size),
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
        applies=lambda cfg, ctx: _has_world(cfg, ctx) and layout_within(cfg, ctx),
        holds=lambda cfg, ctx: _divides(expert_parallel_span(cfg), ctx.world_size),
        message="expert TP x EP x PP must divide the number of GPUs",
        fix="change expert_model_parallel_size (or the GPU count) so that ETP*EP*PP divides it",
        extra_values=(("world_size", _world),),
    ),
    Rule(
        id="data-parallel-divides-global-batch",
        fields=("train.global_batch_size", "train.micro_batch_size"),
        applies=lambda cfg, ctx: (
            dp_known(cfg, ctx) and all_within(cfg, ctx, "train.global_batch_size", "train.micro_batch_size")
        ),
        holds=_batch_divides_over_data_parallel,
        message="the global batch must be a multiple of micro batch x data-parallel size",
        fix="scale train.global_batch_size to a multiple of micro_batch_size * DP",
        extra_values=(("world_size", _world),),
    ),
    Rule(
        id="experts-divisible-by-ep",
        fields=("model.num_moe_experts", "model.expert_model_parallel_size"),
        applies=lambda cfg, ctx: (
            _is_moe(cfg, ctx) and all_within(cfg, ctx, "model.num_moe_experts", "model.expert_model_parallel_size")
        ),
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
        applies=lambda cfg, ctx: (
            layout_within(cfg, ctx)
            and all_within(cfg, ctx, "model.num_layers")
            and cfg.model.pipeline_model_parallel_size > 1
            and cfg.model.pipeline_model_parallel_layout is None
            and cfg.model.num_layers_in_first_pipeline_stage is None
            and cfg.model.num_layers_in_last_pipeline_stage is None
        ),
        holds=lambda cfg, ctx: (
            pipeline_split_layers(cfg)
            % (cfg.model.pipeline_model_parallel_size * (cfg.model.virtual_pipeline_model_parallel_size or 1))
            == 0
        ),
        message="layers must split evenly over pipeline (and virtual pipeline) stages",
        fix="choose num_layers (plus one per account_for_{embedding,loss}_in_pipeline_split) as a multiple of PP * VPP",
    ),
    Rule(
        id="vocab-size-set",
        fields=("model.vocab_size", "tokenizer.tokenizer_type", "tokenizer.vocab_size"),
        holds=lambda cfg, ctx: cfg.model.vocab_size is not None and cfg.model.vocab_size > 0,
        message="the model needs a vocabulary size: model.vocab_size, or with model.vocab_size unset the "
        "NullTokenizer's tokenizer.vocab_size (a Hugging Face tokenizer's is read only when it is loaded, "
        "after the checks made before launch)",
        fix="set model.vocab_size (e.g. 151936 for Qwen3; at least the tokenizer's vocabulary), or "
        "tokenizer.vocab_size with tokenizer.tokenizer_type=NullTokenizer",
    ),
    Rule(
        id="tokenizer-vocab-fits-model",
        fields=("tokenizer.vocab_size", "model.vocab_size"),
        applies=lambda cfg, ctx: (
            cfg.tokenizer.tokenizer_type == "NullTokenizer"
            and _whole(cfg.tokenizer.vocab_size)
            and _whole(cfg.model.vocab_size)
        ),
        holds=_tokenizer_vocab_fits,
        message="Model vocab_size cannot be smaller than tokenizer's vocab_size: the token ids past "
        "model.vocab_size (the end-of-document id among them) would have no embedding",
        fix="raise model.vocab_size to at least tokenizer.vocab_size, or unset tokenizer.vocab_size "
        "(the NullTokenizer then uses model.vocab_size)",
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
        applies=lambda cfg, ctx: cfg.logger.steady_state_window is not None,
        holds=_window_ok,
        message="the steady-state window is two 1-based steps of the run, first <= last",
        fix="e.g. logger.steady_state_window=[3,8], or null for the automatic window",
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
        holds=lambda cfg, ctx: bool(cfg.checkpoint.save),
        message="periodic checkpoints need a directory",
        fix="set checkpoint.save=/path/to/ckpt (or checkpoint.save_interval=null)",
    ),
    Rule(
        id="profile-steps-ordered",
        fields=("profiling.profile_step_start", "profiling.profile_step_end"),
        applies=lambda cfg, ctx: cfg.profiling.use_pytorch_profiler or cfg.profiling.use_host_profiler,
        holds=lambda cfg, ctx: 1 <= cfg.profiling.profile_step_start <= cfg.profiling.profile_step_end,
        message="profiling captures steps start..end (1-based), start <= end",
        fix="e.g. profiling.profile_step_start=5 profiling.profile_step_end=6",
    ),
    Rule(
        id="gpu-park-steps-after-window",
        fields=("profiling.gpu_park_steps", "logger.steady_state_window", "train.train_iters"),
        applies=lambda cfg, ctx: bool(cfg.profiling.gpu_park_steps),
        holds=_parks_after_window,
        message="parked steps are slow by the park: they must lie after the steady-state window (the automatic "
        "one ends before the first parked step, after at least one steady step) and within the run",
        fix="e.g. --max_steps 14 logger.steady_state_window=[4,12] profiling.gpu_park_steps=[13,14]",
    ),
    Rule(
        id="gpu-park-needs-cuda",
        fields=("profiling.gpu_park_steps", "profiling.gpu_park_s", "dist.device"),
        applies=lambda cfg, ctx: bool(cfg.profiling.gpu_park_steps),
        holds=lambda cfg, ctx: cfg.dist.device == "cuda" and 0 < cfg.profiling.gpu_park_s <= 10,
        message="parking holds a GPU with a sleep kernel for 0 < gpu_park_s <= 10 seconds",
        fix="run on GPUs with e.g. profiling.gpu_park_s=0.5, or leave profiling.gpu_park_steps=[]",
    ),
)


# ------------------------------------------------------------------------------------------------
# Settings that would be accepted and then fail (or do nothing) inside the ranks


def _microbatch_group(cfg: ConfigContainer) -> int:
    """megatron-core's ``microbatch_group_size_per_vp_stage`` (its default: the pipeline size)."""
    return cfg.model.microbatch_group_size_per_vp_stage or cfg.model.pipeline_model_parallel_size


def interleaved_schedule_accepts(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    """megatron-core 0.19.2's interleaved 1F1B check (``forward_backward_pipelining_with_interleaving``):
    with M micro-batches, group size N and pipeline size P it raises unless P <= N <= M, and
    unless M % N is 0 or at least P. With the default N = P: M must be a multiple of P."""
    m, n, p = micro_batches_per_step(cfg, ctx), _microbatch_group(cfg), cfg.model.pipeline_model_parallel_size
    if m is None or n is None or p is None:  # the rule applies only where the sizes are known
        return True
    return p <= n <= m and (m % n == 0 or m % n >= p)


def _interleaved(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    m = cfg.model
    return (
        layout_within(cfg, ctx)
        and m.pipeline_model_parallel_size > 1
        and m.virtual_pipeline_model_parallel_size is not None
        and micro_batches_per_step(cfg, ctx) is not None
    )


def _flex_on_cpu(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return cfg.dist.device == "cpu"


def _not_implemented(rule_id: str, field: str, accepted: tuple, message: str, fix: str) -> Rule:
    """``field`` outside ``accepted`` asks for something this package does not do: refused, so that
    no accepted setting goes without its effect."""
    return Rule(
        id=rule_id,
        fields=(field,),
        applies=lambda cfg, ctx: read_field(cfg, field) not in accepted,
        holds=lambda cfg, ctx: False,
        message=message,
        fix=fix,
    )


RUN_RULES: tuple[Rule, ...] = (
    Rule(
        id="min-lr-not-above-lr",
        fields=("optimizer.min_lr", "optimizer.lr"),
        applies=lambda cfg, ctx: (
            cfg.optimizer.min_lr is not None and all_within(cfg, ctx, "optimizer.min_lr", "optimizer.lr")
        ),
        holds=lambda cfg, ctx: cfg.optimizer.min_lr <= cfg.optimizer.lr,
        message="the schedule decays from optimizer.lr down to optimizer.min_lr (megatron-core's "
        "scheduler asserts min_lr <= lr)",
        fix="set optimizer.min_lr at or below optimizer.lr",
    ),
    Rule(
        id="router-topk-within-experts",
        fields=("model.moe_router_topk", "model.num_moe_experts"),
        applies=lambda cfg, ctx: (
            _is_moe(cfg, ctx) and all_within(cfg, ctx, "model.moe_router_topk", "model.num_moe_experts")
        ),
        holds=lambda cfg, ctx: cfg.model.moe_router_topk <= cfg.model.num_moe_experts,
        message="each token is routed to top-k distinct experts; k cannot exceed the expert count",
        fix="lower model.moe_router_topk to at most model.num_moe_experts",
    ),
    Rule(
        id="interleaved-pipeline-micro-batches",
        fields=(
            "train.global_batch_size",
            "train.micro_batch_size",
            "model.pipeline_model_parallel_size",
            "model.virtual_pipeline_model_parallel_size",
            "model.microbatch_group_size_per_vp_stage",
        ),
        applies=_interleaved,
        holds=interleaved_schedule_accepts,
        message="megatron-core's interleaved pipeline schedule runs the M micro-batches of a step in "
        "groups of N (microbatch_group_size_per_vp_stage, default: the pipeline size P) and fails "
        "at step 1 on every rank unless P <= N <= M and M % N is 0 or >= P; with the default N = P, "
        "M must be a multiple of P",
        fix="choose train.global_batch_size so that global / (micro_batch_size x DP) is a multiple of "
        "the pipeline size (and at least it)",
        extra_values=(("world_size", _world),),
        derived_values=(("micro_batches_per_step", micro_batches_per_step),),
    ),
    _not_implemented(
        "mtp-not-built",
        "model.mtp_num_layers",
        (None, 0),
        "multi-token prediction is not built here: the GPT provider gives megatron-core no MTP block, "
        "so training with MTP layers fails in the first step",
        "set model.mtp_num_layers=null",
    ),
    Rule(
        id="cpu-mode-no-flex-dispatcher",
        fields=("dist.device", "model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend"),
        applies=_flex_on_cpu,
        holds=lambda cfg, ctx: cfg.model.moe_token_dispatcher_type != "flex",
        message="the flex dispatcher's backends are CUDA kernels (DeepEP and HybridEP from the deep_ep "
        "package, NCCL EP from NCCL through Transformer Engine); the CPU smoke mode cannot run them",
        fix="use plain alltoall in CPU mode (--moe_flex_dispatcher_backend None), or run on GPUs",
    ),
)

GENERAL_RULES: tuple[Rule, ...] = RANGE_RULES + CONFIG_RULES + PRECISION_RULES + RUN_RULES + CHECKPOINT_RULES
"""Every general rule: ranges first, then the rules above, then what would fail inside the ranks."""
