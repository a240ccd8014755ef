"""Rules that the model's state fits the memory it will live in: one GPU of the target type per rank,
or this host for all ranks of a CPU smoke-mode job; on a GPU, with one micro-batch's activations too.

Sizes that pass every other rule (``model.num_moe_experts=1000000``) otherwise fail later in every
rank, allocating weights; a long sequence fails in the first step. The estimates
(``facts/memory_estimate.py``, ``facts/activation_estimate.py``) are lower bounds, so only what
cannot fit is refused; the message shows the estimate, its parts and the limit. Where the bound comes
near the smallest GPU sold under the target's name, a warning says the run will likely run out of
memory: the bound was :data:`BOUND_SHARE_OF_PEAK` of the peak measured where both were recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from megatron.bridge.training.config_stages.facts.activation_estimate import activation_estimate
from megatron.bridge.training.config_stages.facts.gpu_catalog import gpu_memory_bytes, smallest_gpu_memory_bytes
from megatron.bridge.training.config_stages.facts.memory_estimate import (
    cpu_job_estimate,
    estimable,
    estimate_per_rank,
    gib,
    host_memory_bytes,
    limit_text,
    within_limit,
)
from megatron.bridge.training.config_stages.schema.rule_base import Rule, RuleContext

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

MEMORY_FIELDS: tuple[str, ...] = (
    "model.num_layers",
    "model.hidden_size",
    "model.ffn_hidden_size",
    "model.num_moe_experts",
    "model.moe_ffn_hidden_size",
    "model.vocab_size",
    "model.tensor_model_parallel_size",
    "model.pipeline_model_parallel_size",
    "model.expert_model_parallel_size",
)
"""The sizes shown beside a memory refusal (the estimate reads a few more)."""

_FIX = (
    "spread the model over more GPUs (-tp/-pp/-ep, with -ng to match), use the distributed optimizer "
    "(ddp.use_distributed_optimizer=true) and more data-parallel ranks, or make the model smaller"
)


def _gpu_limit(cfg: ConfigContainer, ctx: RuleContext) -> int | None:
    return None if cfg.dist.device == "cpu" else gpu_memory_bytes(ctx.device_name)


def _gpu_applies(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return _gpu_limit(cfg, ctx) is not None and estimable(cfg, ctx)


BOUND_SHARE_OF_PEAK = 0.83
"""The state-plus-activations bound over the peak allocated GPU memory measured (Qwen3-30B-A3B's layer,
4 layers, emulated EP=16, 8 micro-batches: 9.3 GiB of 11.3 in every arm of four runs on an H200, two
each at 1e5ee78 and 609c815, ``docs/benchmarks/results/ep_emulated_sync_stream_1e5ee78/``). Checked
on both sides at 48 layers on H100s: EP=1 with 8 experts (bound 70.1 GiB, expected 84.4) ran out of
memory, emulated EP=16 (bound 56.8 GiB, expected 68.4) trained."""

ACTIVATION_FIELDS: tuple[str, ...] = (
    "model.seq_length",
    "train.micro_batch_size",
    "model.num_layers",
    "model.hidden_size",
    "model.moe_router_topk",
    "model.moe_ffn_hidden_size",
    "model.recompute_granularity",
    "model.tensor_model_parallel_size",
    "model.context_parallel_size",
    "model.expert_model_parallel_size",
)


def _state_and_activations(cfg: ConfigContainer, ctx: RuleContext) -> int:
    return estimate_per_rank(cfg, ctx.world_size).total_bytes + activation_estimate(cfg).total_bytes


def _state_within_gpu(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return within_limit(estimate_per_rank(cfg, ctx.world_size).total_bytes, _gpu_limit(cfg, ctx))


def _state_fits_gpu(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return _gpu_applies(cfg, ctx) and _state_within_gpu(cfg, ctx)


def _bound_fits_gpu(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return _state_fits_gpu(cfg, ctx) and within_limit(_state_and_activations(cfg, ctx), _gpu_limit(cfg, ctx))


def _expected_peak(cfg: ConfigContainer, ctx: RuleContext) -> float:
    return _state_and_activations(cfg, ctx) / BOUND_SHARE_OF_PEAK


_GPU_LIMIT = ("limit", lambda cfg, ctx: limit_text(_gpu_limit(cfg, ctx), f"on one {ctx.device_name}"))

_ACTIVATION_VALUES = (
    ("state", lambda cfg, ctx: estimate_per_rank(cfg, ctx.world_size).describe()),
    ("activations", lambda cfg, ctx: activation_estimate(cfg).describe()),
)


def _host_applies(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return cfg.dist.device == "cpu" and host_memory_bytes() is not None and estimable(cfg, ctx)


def _ranks_on_host(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return _host_applies(cfg, ctx) and not cfg.emulation.enabled


def _emulated_on_host(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return _host_applies(cfg, ctx) and cfg.emulation.enabled


def _fits_host(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return within_limit(cpu_job_estimate(cfg, ctx.world_size).total_bytes, host_memory_bytes())


_HOST_VALUES = (
    ("estimate", lambda cfg, ctx: cpu_job_estimate(cfg, ctx.world_size).describe()),
    ("limit", lambda cfg, ctx: limit_text(host_memory_bytes(), "on this host")),
)


MEMORY_RULES: tuple[Rule, ...] = (
    Rule(
        id="model-state-fits-gpu-memory",
        fields=MEMORY_FIELDS,
        applies=_gpu_applies,
        holds=_state_within_gpu,
        message="the model's weights, gradients and optimizer state alone (a lower bound: activations and "
        "buffers come on top) need more memory per rank than one GPU of the target type has: every rank "
        "would fail allocating them",
        fix=_FIX,
        derived_values=(
            ("estimate", lambda cfg, ctx: estimate_per_rank(cfg, ctx.world_size).describe()),
            _GPU_LIMIT,
        ),
        group="memory",
    ),
    Rule(
        id="model-and-activations-fit-gpu-memory",
        fields=ACTIVATION_FIELDS,
        applies=_state_fits_gpu,
        holds=lambda cfg, ctx: within_limit(_state_and_activations(cfg, ctx), _gpu_limit(cfg, ctx)),
        message="the model's state and what one micro-batch's forward keeps for its backward (a lower bound: "
        "one micro-batch in flight, no allocator overhead) need more memory per rank than one GPU of the target "
        "type has: every rank would run out of memory in its first step",
        fix="recompute activations (model.recompute_granularity=selective with model.recompute_modules, or full), "
        "a shorter sequence or micro-batch (model.seq_length, train.micro_batch_size), or spread each layer's "
        "tokens over more GPUs (-tp with model.sequence_parallel=true, -cp)",
        derived_values=(
            *_ACTIVATION_VALUES,
            _GPU_LIMIT,
        ),
        group="memory",
    ),
    Rule(
        id="expected-peak-fits-smallest-gpu",
        fields=ACTIVATION_FIELDS,
        applies=_bound_fits_gpu,
        holds=lambda cfg, ctx: within_limit(_expected_peak(cfg, ctx), smallest_gpu_memory_bytes(ctx.device_name)),
        message=f"the model's state and one micro-batch's activations (a lower bound) over {BOUND_SHARE_OF_PEAK}, "
        "the share of the measured peak that bound was, exceed the smallest GPU sold under the target's name: "
        "the run will likely run out of memory in its first steps there",
        fix="on a larger variant of the type it may fit; else recompute activations "
        "(model.recompute_granularity=selective with model.recompute_modules), a shorter sequence or "
        "micro-batch, or more GPUs for each layer's tokens or the model's state",
        derived_values=(
            *_ACTIVATION_VALUES,
            ("expected peak", lambda cfg, ctx: f"about {gib(_expected_peak(cfg, ctx))}"),
            (
                "smallest",
                lambda cfg, ctx: limit_text(
                    smallest_gpu_memory_bytes(ctx.device_name), f"on the smallest {ctx.device_name}"
                ),
            ),
        ),
        severity="warning",
        group="memory",
    ),
    Rule(
        id="model-state-fits-host-memory",
        fields=MEMORY_FIELDS + ("dist.device",),
        applies=_ranks_on_host,
        holds=_fits_host,
        message="CPU smoke mode runs every rank on this host, and their weights, gradients and optimizer state "
        "alone (a lower bound) need more memory than the host has: the ranks would fail allocating them, or the "
        "host would start swapping",
        fix="use fewer processes (-ng) or a smaller model (CPU smoke mode checks that a configuration runs, "
        "not how fast: the tiny recipe is meant for it)",
        derived_values=_HOST_VALUES,
        group="memory",
    ),
    Rule(
        id="emulated-rank-fits-host-memory",
        fields=MEMORY_FIELDS + ("dist.device", "emulation.world_size"),
        applies=_emulated_on_host,
        holds=_fits_host,
        message="an emulated world runs on the CPU as one process holding the one rank it plays, and that rank's "
        "weights, gradients and optimizer state alone (a lower bound) need more memory than the host has: the "
        "process would fail allocating them, or the host would start swapping",
        fix="an emulated world is always one process, whatever -ng says: shrink the share of the rank it plays "
        "(a wider layout, more -ep or -tp with -ng to match, or the distributed optimizer over more data-parallel "
        "ranks) or the model (fewer layers keep each layer's shapes: model.num_layers=4), or emulate on a GPU "
        "(-g h100)",
        derived_values=_HOST_VALUES,
        group="memory",
    ),
)
