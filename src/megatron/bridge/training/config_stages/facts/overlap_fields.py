"""The overlap switches of ``CommOverlapConfig``: where each is applied and how ``null`` is decided.

Each switch has one owner, ``comm_overlap.<switch>``. Its *targets* are the megatron-core fields
that read it (``model.*``, ``ddp.*``, ``optimizer.*``); they are copies written at finalize from the
owner and never inputs (:mod:`megatron.bridge.training.config_stages.facts.ownership` refuses writes to them). An
explicit owner value wins; ``null`` means "framework decides", and the decision is made here by the
switch's ``compute`` function, from fields that are not copies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from megatron.bridge.training.config_stages.facts.parallel_layout import data_parallel_size, positive_size
from megatron.bridge.training.config_stages.schema.rule_base import RuleContext, field_default

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

COMPUTED = "computed"
"""Provenance layer of a value the framework chose."""


@dataclass(frozen=True)
class EffectiveValue:
    """The value a switch ends up with, the layer that set it, and why."""

    name: str
    value: Any
    source: str
    """``recipe``, ``yaml``, ``flag``, ``cli`` or ``computed``."""
    detail: str = ""

    @property
    def key(self) -> str:
        """Dotted key of the owner field."""
        return f"comm_overlap.{self.name}"


DEFAULT_BUCKET_SIZE = 128 * 1024 * 1024
"""Grad-reduce/param-gather bucket (bytes) chosen when the distributed optimizer runs with DP > 1."""

Partial = dict[str, "EffectiveValue"]
ComputeFn = Callable[["ConfigContainer", Partial, RuleContext], tuple[Any, str]]


@dataclass(frozen=True)
class OverlapField:
    """One switch of ``CommOverlapConfig``: its megatron-facing copies and how ``null`` is decided."""

    name: str
    targets: tuple[str, ...]
    compute: ComputeFn
    rule_text: str
    """What ``null`` becomes, for the docs."""
    is_bool: bool = True
    """Takes true/false/null (checked by the ``overlap-switch-is-bool`` rules)."""

    @property
    def key(self) -> str:
        """Dotted key of the owner."""
        return f"comm_overlap.{self.name}"


def _value(partial: Partial, name: str) -> Any:
    return partial[name].value if name in partial else None


def _pipeline(cfg: ConfigContainer) -> tuple[int, int | None]:
    """PP and VPP; a PP that is not a positive integer counts as 1 here (its range rule reports it)."""
    m = cfg.model
    return positive_size(m.pipeline_model_parallel_size) or 1, positive_size(m.virtual_pipeline_model_parallel_size)


def data_parallel(cfg: ConfigContainer, ctx: RuleContext) -> int | None:
    """Data-parallel size for the context's world size, else ``comm_overlap.data_parallel_size``
    (``None`` when neither is known)."""
    if ctx.world_size is None:
        return cfg.comm_overlap.data_parallel_size
    return data_parallel_size(cfg, ctx.world_size)


def gloo_on_cuda(cfg: ConfigContainer) -> bool:
    """Ranks on GPUs talking over gloo (e.g. two ranks sharing one GPU, where NCCL refuses)."""
    return cfg.dist.device == "cuda" and cfg.dist.effective_backend == "gloo"


def _compute_overlap_p2p(cfg, partial, ctx):
    pp, vpp = _pipeline(cfg)
    if pp > 1 and vpp is not None:
        if _value(partial, "batch_p2p_comm") is True:
            return False, "PP>1 with VPP, but batch_p2p_comm was set explicitly"
        return True, "PP>1 with VPP: the interleaved schedule overlaps p2p"
    return False, "needs PP>1 with VPP"


def _compute_batch_p2p(cfg, partial, ctx):
    pp, _ = _pipeline(cfg)
    if pp > 1 and not _value(partial, "overlap_p2p_comm"):
        return True, "PP>1 without overlapped p2p: batched p2p"
    return False, "PP=1 or p2p overlapped"


def _distributed_dp(cfg, ctx) -> tuple[bool | None, str]:
    """Whether the distributed optimizer runs with DP>1 (``None`` when DP is unknown)."""
    if not cfg.ddp.use_distributed_optimizer:
        return False, "no distributed optimizer"
    dp = data_parallel(cfg, ctx)
    if dp is None:
        return None, "data-parallel size unknown (no world size given): left off"
    return dp > 1, f"distributed optimizer with DP={dp}"


def _compute_dp_overlap(cfg, partial, ctx):
    """Grad-reduce and param-gather overlap: on with the distributed optimizer and DP > 1."""
    if gloo_on_cuda(cfg):
        return False, "gloo on CUDA tensors runs DP collectives synchronously"
    on, why = _distributed_dp(cfg, ctx)
    return bool(on), why


def _compute_bucket(cfg, partial, ctx):
    if cfg.ddp.num_buckets is not None:
        return None, "ddp.num_buckets is set"
    on, why = _distributed_dp(cfg, ctx)
    if on and (_value(partial, "overlap_grad_reduce") or _value(partial, "overlap_param_gather")):
        return DEFAULT_BUCKET_SIZE, f"{why}: 128 MiB buckets"
    return field_default(cfg, "ddp.bucket_size"), "no overlapped DP collectives: megatron-core's default"


def _compute_align(cfg, partial, ctx):
    pp, vpp = _pipeline(cfg)
    if pp > 1 and vpp is not None and _value(partial, "overlap_param_gather"):
        return True, "interleaved pipeline with overlapped param gather"
    return False, "needs PP>1 with VPP and overlapped param gather"


def _off(reason: str) -> ComputeFn:
    return lambda cfg, partial, ctx: (False, reason)


def _megatron_default(target: str | None) -> ComputeFn:
    """The default of ``target``'s own class (``None`` without a target)."""
    return lambda cfg, partial, ctx: (
        field_default(cfg, target) if target else None,
        "framework default",
    )


def _kept(name: str, targets: tuple[str, ...], is_bool: bool = False) -> OverlapField:
    return OverlapField(
        name,
        targets,
        _megatron_default(targets[0] if targets else None),
        "keeps the megatron-core default",
        is_bool=is_bool,
    )


OFF_UNLESS_REQUESTED = "off unless requested"

OVERLAP_FIELDS: tuple[OverlapField, ...] = (
    OverlapField("tp_comm_overlap", ("model.tp_comm_overlap",), _off(OFF_UNLESS_REQUESTED), OFF_UNLESS_REQUESTED),
    _kept("tp_comm_overlap_cfg", ()),
    _kept("tp_comm_bootstrap_backend", ("model.tp_comm_bootstrap_backend",)),
    OverlapField("overlap_p2p_comm", ("model.overlap_p2p_comm",), _compute_overlap_p2p, "on when PP>1 with VPP"),
    OverlapField("batch_p2p_comm", ("model.batch_p2p_comm",), _compute_batch_p2p, "on when PP>1 without VPP"),
    OverlapField(
        "overlap_grad_reduce",
        ("ddp.overlap_grad_reduce",),
        _compute_dp_overlap,
        "on with the distributed optimizer and DP>1",
    ),
    OverlapField(
        "overlap_param_gather",
        ("ddp.overlap_param_gather", "optimizer.overlap_param_gather"),
        _compute_dp_overlap,
        "on with the distributed optimizer and DP>1",
    ),
    OverlapField(
        "overlap_param_gather_with_optimizer_step",
        ("optimizer.overlap_param_gather_with_optimizer_step",),
        _off(OFF_UNLESS_REQUESTED),
        OFF_UNLESS_REQUESTED,
    ),
    OverlapField(
        "align_param_gather",
        ("ddp.align_param_gather",),
        _compute_align,
        "on when PP>1 with VPP and param gather is overlapped",
    ),
    OverlapField(
        "bucket_size",
        ("ddp.bucket_size",),
        _compute_bucket,
        "128 MiB with the distributed optimizer and DP>1",
        is_bool=False,
    ),
    _kept("defer_embedding_wgrad_compute", ("model.defer_embedding_wgrad_compute",), is_bool=True),
    _kept("wgrad_deferral_limit", ("model.wgrad_deferral_limit",)),
    OverlapField(
        "overlap_moe_expert_parallel_comm",
        ("model.overlap_moe_expert_parallel_comm",),
        _off(OFF_UNLESS_REQUESTED),
        "off unless requested (most recipes leave it off: switch it on by override)",
    ),
    OverlapField(
        "delay_wgrad_compute",
        ("model.delay_wgrad_compute", "ddp.delay_wgrad_compute"),
        _off(OFF_UNLESS_REQUESTED),
        OFF_UNLESS_REQUESTED,
    ),
)
"""Every switch, in resolution order (a computed switch may read the ones before it)."""

OVERLAP_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in OVERLAP_FIELDS)
BOOL_SWITCHES: tuple[str, ...] = tuple(f.name for f in OVERLAP_FIELDS if f.is_bool)
