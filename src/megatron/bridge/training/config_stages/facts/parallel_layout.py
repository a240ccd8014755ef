"""Sizes that follow from the parallel layout: model and expert spans, data-parallel size, micro-batches.

Read by the rules (general, overlap, checkpoint), the computed overlap defaults and the harness's
GPU-count checks, so every one of them computes a size the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from megatron.bridge.training.config_stages.schema.field_ranges import within
from megatron.bridge.training.config_stages.schema.rule_base import RuleContext

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer


MAX_WORLD_SIZE = 131072
"""The most ranks a job may have (``-ng``, and a checkpoint's recorded layout): 2^17, above the largest
training jobs run today. A larger count is a typo or a damaged record; every check that enumerates
ranks or GPU counts is bounded by it."""


def positive_size(value: object) -> int | None:
    """``value`` when it is a whole number >= 1 (a parallel size), else ``None``: text, zero, a
    negative number or ``None`` is reported by its range rule, and every size computed from it is
    unknown instead of a crash."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def model_parallel_size(cfg: ConfigContainer) -> int | None:
    """GPUs one model replica spans (TP x PP x CP); ``None`` when a size is not a positive integer."""
    m = cfg.model
    tp, pp, cp = (
        positive_size(v)
        for v in (m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size)
    )
    return None if tp is None or pp is None or cp is None else tp * pp * cp


def expert_parallel_span(cfg: ConfigContainer) -> int:
    """GPUs one expert replica spans (expert TP x EP x PP)."""
    m = cfg.model
    etp = m.expert_tensor_parallel_size or m.tensor_model_parallel_size
    return etp * m.expert_model_parallel_size * m.pipeline_model_parallel_size


def data_parallel_size(cfg: ConfigContainer, world_size: int) -> int | None:
    """Data-parallel size for ``world_size`` GPUs, ``None`` when the layout does not divide it or a
    parallel size is out of its range (zero or negative: its range rule reports it; every caller,
    the overlap defaults among them, then treats DP as unknown instead of dividing by zero)."""
    span = model_parallel_size(cfg)
    if span is None or positive_size(world_size) is None:
        return None
    return world_size // span if world_size % span == 0 else None


def pipeline_split_layers(cfg: ConfigContainer) -> int:
    """Layers the pipeline split counts: decoder layers plus embedding/loss stages when accounted."""
    m = cfg.model
    return m.num_layers + int(m.account_for_embedding_in_pipeline_split) + int(m.account_for_loss_in_pipeline_split)


def lr_decay_iters(cfg: ConfigContainer) -> int:
    """Iterations the learning rate decays over (``train.train_iters`` when not set)."""
    return cfg.scheduler.lr_decay_iters or cfg.train.train_iters


def all_within(cfg: ConfigContainer, ctx: RuleContext, *fields: str) -> bool:
    """Whether every field is inside its range (rules that compute with it skip it otherwise: its
    range rule already reports it, and a zero size would divide by zero)."""
    return all(within(cfg, ctx, f) for f in fields)


def layout_within(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return all_within(cfg, ctx, *LAYOUT_FIELDS)


def known_data_parallel_size(cfg: ConfigContainer, ctx: RuleContext) -> int | None:
    """DP for the context's world size; ``None`` without a world size, with a layout size out of its
    range, or when the layout does not divide the world."""
    if ctx.world_size is None or not layout_within(cfg, ctx):
        return None
    return data_parallel_size(cfg, ctx.world_size)


def dp_known(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return known_data_parallel_size(cfg, ctx) is not None


LAYOUT_FIELDS: tuple[str, ...] = (
    "model.tensor_model_parallel_size",
    "model.pipeline_model_parallel_size",
    "model.virtual_pipeline_model_parallel_size",
    "model.context_parallel_size",
    "model.expert_model_parallel_size",
    "model.expert_tensor_parallel_size",
)


def micro_batches_per_step(cfg: ConfigContainer, ctx: RuleContext) -> int | None:
    """Micro-batches each data-parallel rank runs per step (``None`` without a world size)."""
    dp = known_data_parallel_size(cfg, ctx)
    if dp is None or not all_within(cfg, ctx, "train.global_batch_size", "train.micro_batch_size"):
        return None
    return cfg.train.global_batch_size // (cfg.train.micro_batch_size * dp)
