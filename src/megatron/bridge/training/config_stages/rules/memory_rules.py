"""Rules that the model's state fits the memory it will live in: one GPU of the target type per rank,
or this host for all ranks of a CPU smoke-mode job.

Sizes that pass every other rule (``model.num_moe_experts=1000000``) otherwise fail later in every
rank, allocating weights. The estimate (``facts/memory_estimate.py``) is a lower bound, so only
what cannot fit is refused; the message shows the estimate, its parts and the limit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from megatron.bridge.training.config_stages.facts.gpu_catalog import gpu_memory_bytes
from megatron.bridge.training.config_stages.facts.memory_estimate import (
    cpu_job_estimate,
    estimable,
    estimate_per_rank,
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
        holds=lambda cfg, ctx: within_limit(estimate_per_rank(cfg, ctx.world_size).total_bytes, _gpu_limit(cfg, ctx)),
        message="the model's weights, gradients and optimizer state alone (a lower bound: activations and "
        "buffers come on top) need more memory per rank than one GPU of the target type has: every rank "
        "would fail allocating them",
        fix=_FIX,
        derived_values=(
            ("estimate", lambda cfg, ctx: estimate_per_rank(cfg, ctx.world_size).describe()),
            ("limit", lambda cfg, ctx: limit_text(_gpu_limit(cfg, ctx), f"on one {ctx.device_name}")),
        ),
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
