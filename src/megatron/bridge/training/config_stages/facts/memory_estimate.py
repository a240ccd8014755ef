"""A lower bound of the memory one rank needs for the model's weights, gradients and optimizer state,
and the memory the target has (one GPU of the ``-g`` type, or this host for CPU smoke mode).

Read by the memory rules (``training/config_stages/rules/memory_rules.py``): a size such as
``model.num_moe_experts=1000000`` passes every other rule and then fails in every rank allocating its
weights. The estimate counts parameters per rank from the shapes and the parallel layout and bytes
per parameter from the precision and the optimizer; every choice errs low (activations, buffers,
norms and biases left out, the smallest dtype megatron-core may use, embeddings and layers spread
evenly over the pipeline), so a configuration it refuses cannot fit, while one it passes may still
not (the allocator then says so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from megatron.bridge.training.config_stages.facts.parallel_layout import all_within, layout_within
from megatron.bridge.training.config_stages.schema.rule_base import RuleContext
from megatron.bridge.utils.host import current_host

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

SHAPE_SIZE_FIELDS: tuple[str, ...] = (
    "model.num_layers",
    "model.hidden_size",
    "model.num_attention_heads",
    "model.num_query_groups",
    "model.kv_channels",
    "model.ffn_hidden_size",
    "model.num_moe_experts",
    "model.moe_ffn_hidden_size",
    "model.make_vocab_size_divisible_by",
)
"""Sizes the estimate multiplies; each has a range rule (out of range: no estimate, the range says it)."""

CPU_RANK_BASE_BYTES = 512 * 2**20
"""What one CPU smoke-mode rank holds before its model: its interpreter with torch and megatron-core
imported (about 1 GiB measured; half is counted)."""

GIB = 2**30


@dataclass(frozen=True)
class MemoryEstimate:
    """Parameters one rank holds and the bytes of their weights, gradients and optimizer state."""

    params: int
    weight_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    base_bytes: int = 0
    """Memory the ranks hold besides their model state (CPU ranks only)."""
    scope: str = "per rank"
    """Whose memory this is: one rank's, or every rank's on one host."""

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes + self.base_bytes

    def describe(self) -> str:
        """``at least 412.3 GiB per rank: 2.46e+10 parameters; weights 45.8 GiB, ...``"""
        base = f", processes {gib(self.base_bytes)}" if self.base_bytes else ""
        return (
            f"at least {gib(self.total_bytes)} {self.scope}: {self.params:.3g} parameters; weights "
            f"{gib(self.weight_bytes)}, gradients {gib(self.grad_bytes)}, optimizer state "
            f"{gib(self.optimizer_bytes)}{base}"
        )


def gib(nbytes: float) -> str:
    return f"{nbytes / GIB:,.1f} GiB"


def positive(value: Any) -> int:
    """``value`` when it is a positive integer, else 0 (an unset optional size adds nothing)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def estimable(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    """Whether every size the estimate reads is inside its range (else the range rules speak)."""
    return layout_within(cfg, ctx) and all_within(cfg, ctx, *SHAPE_SIZE_FIELDS)


def moe_layer_count(cfg: ConfigContainer, mlp_cheaper: bool) -> int:
    """How many of the layers are MoE layers; for a pattern this module does not read (a string),
    the count that gives the smaller estimate."""
    m = cfg.model
    if not m.num_moe_experts:
        return 0
    freq = m.moe_layer_freq
    if isinstance(freq, int) and not isinstance(freq, bool) and freq >= 1:
        return math.ceil(m.num_layers / freq)
    if isinstance(freq, (list, tuple)):
        return min(m.num_layers, sum(1 for x in freq if x))
    return 0 if mlp_cheaper else m.num_layers


def layer_widths(cfg: ConfigContainer) -> tuple[int, int, int]:
    """(query groups, head size, dense FFN size) with megatron-core's defaults for unset ones."""
    m = cfg.model
    heads = m.num_attention_heads
    return m.num_query_groups or heads, m.kv_channels or m.hidden_size // heads, m.ffn_hidden_size or 4 * m.hidden_size


def _param_counts(cfg: ConfigContainer) -> tuple[int, int]:
    """``(dense, expert)`` parameters of the whole model (norms and biases left out)."""
    m = cfg.model
    hidden, heads = m.hidden_size, m.num_attention_heads
    groups, kv, ffn = layer_widths(cfg)
    mlp_factor = (2 if m.gated_linear_unit else 1) + 1  # fc1 (doubled when gated) and fc2
    attention = 2 * hidden * heads * kv + 2 * hidden * groups * kv
    dense_mlp = mlp_factor * hidden * ffn
    experts = positive(m.num_moe_experts)
    expert_mlps = experts * mlp_factor * hidden * (m.moe_ffn_hidden_size or ffn)
    moe_dense = experts * hidden + mlp_factor * hidden * positive(m.moe_shared_expert_intermediate_size)
    moe_layers = moe_layer_count(cfg, mlp_cheaper=dense_mlp <= expert_mlps + moe_dense)
    padding = m.make_vocab_size_divisible_by * m.tensor_model_parallel_size
    vocab = -(-positive(m.vocab_size) // padding) * padding
    embeddings = vocab * hidden * (1 if m.share_embeddings_and_output_weights else 2)
    dense = m.num_layers * attention + (m.num_layers - moe_layers) * dense_mlp + moe_layers * moe_dense + embeddings
    return dense, moe_layers * expert_mlps


def _weight_bytes(cfg: ConfigContainer) -> int:
    m = cfg.model
    return 1 if getattr(m, "fp8_param", False) else 2 if (m.bf16 or m.fp16) else 4


def _dtype_bytes(dtype: Any, default: int) -> int:
    return getattr(dtype, "itemsize", default)


def _optimizer_bytes_per_param(cfg: ConfigContainer, weight: int) -> int:
    """Bytes of optimizer state per parameter before sharding: the fp32 main copy under mixed
    precision (2 when bf16 keeps only the remainders) and Adam's two moments; other optimizers
    count only the main copy, and offloaded state counts nothing."""
    opt = cfg.optimizer
    if opt.optimizer_cpu_offload:
        return 0
    aware = opt.use_precision_aware_optimizer
    main = 0 if weight >= 4 else _dtype_bytes(opt.main_params_dtype, 4) if aware else 4
    if main and cfg.model.bf16 and getattr(opt, "store_param_remainders", False):
        main = 2
    if opt.optimizer != "adam":
        return main
    moments = (_dtype_bytes(opt.exp_avg_dtype, 4) + _dtype_bytes(opt.exp_avg_sq_dtype, 4)) if aware else 8
    return main + moments


def _shard(count: int, shards: int | None) -> int:
    """``count`` split over ``shards`` ranks; nothing when the shard count is unknown (no world size)."""
    return count // shards if shards else 0


def estimate_per_rank(cfg: ConfigContainer, world_size: int | None) -> MemoryEstimate:
    """The lower bound of one rank's model state (see the module docstring); call it only where
    :func:`estimable` holds."""
    m = cfg.model
    dense, expert = _param_counts(cfg)
    etp = m.expert_tensor_parallel_size or m.tensor_model_parallel_size
    dense_span = m.tensor_model_parallel_size * m.pipeline_model_parallel_size
    expert_span = m.expert_model_parallel_size * etp * m.pipeline_model_parallel_size
    dense_rank, expert_rank = dense // dense_span, expert // expert_span
    dense_dp = world_size // dense_span if world_size else None
    expert_dp = world_size // expert_span if world_size else None
    weight = _weight_bytes(cfg)
    grad = 4 if cfg.ddp.grad_reduce_in_fp32 else weight
    optimizer = _optimizer_bytes_per_param(cfg, weight)
    if cfg.ddp.use_megatron_fsdp:  # weights and gradients are sharded over data-parallel ranks too
        stored = _shard(dense_rank, dense_dp) + _shard(expert_rank, expert_dp)
        return MemoryEstimate(dense_rank + expert_rank, stored * weight, stored * grad, stored * optimizer)
    if cfg.ddp.use_distributed_optimizer:
        optimizer_bytes = (_shard(dense_rank, dense_dp) + _shard(expert_rank, expert_dp)) * optimizer
    else:
        optimizer_bytes = (dense_rank + expert_rank) * optimizer
    params = dense_rank + expert_rank
    return MemoryEstimate(params, params * weight, params * grad, optimizer_bytes)


def within_limit(needed: float, limit: int | None) -> bool:
    """``needed <= limit``; an unknown limit refuses nothing (the memory rules apply only where it is known)."""
    return limit is None or needed <= limit


def limit_text(limit: int | None, where: str) -> str:
    """``80.0 GiB on this host`` (``where`` after the size), or that the limit is unknown."""
    return f"{gib(limit)} {where}" if limit is not None else f"unknown {where}"


def host_memory_bytes() -> int | None:
    """Memory the machine decisions are made for lets this process's group use (``current_host()``);
    ``None`` when it cannot be read."""
    return current_host().memory_bytes()


def cpu_job_estimate(cfg: ConfigContainer, world_size: int | None) -> MemoryEstimate:
    """What the ranks of a CPU smoke-mode job hold together: all run on this host (in an emulated
    world, one process plays one rank: its share of the layout of ``world_size``)."""
    ranks = 1 if cfg.emulation.enabled else world_size or 1
    one = estimate_per_rank(cfg, world_size)
    return MemoryEstimate(
        one.params * ranks,
        one.weight_bytes * ranks,
        one.grad_bytes * ranks,
        one.optimizer_bytes * ranks,
        CPU_RANK_BASE_BYTES * ranks,
        f"for the {ranks} rank(s) on this host",
    )
