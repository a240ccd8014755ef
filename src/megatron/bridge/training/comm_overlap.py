"""Communication overlap: ``CommOverlapConfig``, the one owner of every overlap switch.

Set a switch here (``cfg.comm_overlap.overlap_moe_expert_parallel_comm = True``, or the dotted
override ``comm_overlap.overlap_moe_expert_parallel_comm=true``); ``None`` means "framework
decides". ``cfg.validate()`` resolves every switch once (an explicit value wins, ``None`` is
computed), writes the effective values to the megatron-core fields that read them
(``model.overlap_moe_expert_parallel_comm``, ``model.delay_wgrad_compute``, ``ddp.*``, ...: copies,
never inputs), and raises ``CommOverlapConfigError`` listing every unmet prerequisite.

The parts, one job each, live in :mod:`megatron.bridge.training.overlap`: the switches and their
computed defaults (``fields``), effective values (``resolution``), the prerequisites (``rules``) and
the docs page (``docs``; ``python -m megatron.bridge.training.comm_overlap --write-docs`` regenerates
``docs/training/communication-overlap.md``). Who owns which megatron-core field is in
:mod:`megatron.bridge.training.resolution.ownership`.

Scripts written for Megatron-Bridge call ``cfg.comm_overlap.finalize()`` and
``cfg.comm_overlap.setup(model, optimizer, ddp)`` themselves (or
``runtime_config_update(cfg)``): both are views of the same resolution, never a second one.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Optional

from megatron.bridge.training.resolution import ownership
from megatron.bridge.training.errors import CommOverlapConfigError
from megatron.bridge.training.overlap.fields import BOOL_SWITCHES, DEFAULT_BUCKET_SIZE, OVERLAP_FIELDS, OverlapField
from megatron.bridge.training.overlap.resolution import (
    EffectiveValue,
    apply_overlap_values,
    format_effective_values,
    resolve_overlap_values,
)
from megatron.bridge.training.overlap.rules import OVERLAP_RULES
from megatron.bridge.training.rules.core import RuleContext, check_rules
from megatron.bridge.utils.strict_fields import StrictFields

_SELF_CONTAINED_RULE_IDS = frozenset({"tp-comm-bootstrap-backend-known", "data-parallel-size-matches-layout"})
_SELF_CONTAINED_RULES = tuple(
    r for r in OVERLAP_RULES if r.group == "types" or r.id in _SELF_CONTAINED_RULE_IDS
)
"""Rules that read nothing but ``comm_overlap`` itself: what ``finalize()`` can check alone."""


@dataclass(frozen=True)
class _NcclOnGpus:
    """The process-group facts ``setup`` assumes when it is not given ``dist_config``."""

    device: str = "cuda"
    effective_backend: str = "nccl"


@dataclass
class _SetupView:
    """The parts of a container the overlap resolution reads, assembled from ``setup``'s arguments."""

    model: Any
    optimizer: Any
    ddp: Any
    comm_overlap: Any
    dist: Any
    mixed_precision: Any = None
    """``None``: the precision copies are not ``setup``'s business (``mixed_precision`` owns them)."""
    provenance: dict[str, str] = field(default_factory=dict)


@dataclass(kw_only=True)
class CommOverlapConfig(StrictFields):
    """User-facing overlap switches. ``None`` means "let the framework decide" (see OVERLAP_FIELDS).

    An explicit value always wins and is never silently changed: if it cannot be honoured,
    ``cfg.validate()`` raises ``CommOverlapConfigError`` naming the field and the fix.
    """

    tp_comm_overlap: Optional[bool] = None
    """Overlap tensor-parallel communication with GEMMs (TE userbuffers; TP>=2, sequence parallel)."""
    tp_comm_overlap_cfg: Optional[dict[str, Any]] = None
    """Per-GEMM userbuffer settings for TP overlap; ``None`` uses Transformer Engine's defaults."""
    tp_comm_bootstrap_backend: Optional[str] = None
    """Bootstrap backend of the TP-overlap userbuffers (``nccl``, ``mpi``, ``gloo``)."""
    overlap_p2p_comm: Optional[bool] = None
    """Overlap pipeline send/recv with compute (interleaved pipeline schedule only)."""
    batch_p2p_comm: Optional[bool] = None
    """Batch pipeline send/recv into one call (excludes overlap_p2p_comm)."""
    overlap_grad_reduce: Optional[bool] = None
    """Overlap data-parallel gradient reduce-scatter/all-reduce with the backward pass."""
    overlap_param_gather: Optional[bool] = None
    """Overlap the distributed optimizer's parameter all-gather with the forward pass."""
    overlap_param_gather_with_optimizer_step: Optional[bool] = None
    """Start the parameter all-gather of the first chunk inside the optimizer step."""
    align_param_gather: Optional[bool] = None
    """Launch the param all-gathers of all pipeline stages together (interleaved pipelines)."""
    bucket_size: Optional[int] = None
    """Gradient/parameter bucket size in bytes for the overlapped collectives."""
    defer_embedding_wgrad_compute: Optional[bool] = None
    """Defer the output-embedding weight-gradient GEMMs to the pipeline flush."""
    wgrad_deferral_limit: Optional[int] = None
    """How many micro-batches of embedding wgrad may be deferred (0 = all)."""
    overlap_moe_expert_parallel_comm: Optional[bool] = None
    """Overlap the MoE expert-parallel dispatch/combine all-to-all with compute of another micro-batch."""
    delay_wgrad_compute: Optional[bool] = None
    """Delay expert weight-gradient GEMMs so they overlap the combine all-to-all (needs EP overlap)."""
    data_parallel_size: Optional[int] = None
    """Data-parallel size the computed overlap defaults are decided for. ``None``: from the world
    size (``validate(world_size=...)`` or ``WORLD_SIZE``). Given without a world size it stands in
    for one; given with one it must agree with the parallel layout."""

    def finalize(self) -> None:
        """Check the switches that need nothing but this object (types, bootstrap backend, DP size).

        Idempotent and non-destructive: the switches stay as written (``None`` keeps meaning
        "framework decides"), so a later ``setup``/``cfg.resolve()`` decides them from the whole
        config. Raises ``CommOverlapConfigError`` listing every problem.
        """
        problems = check_rules(_SELF_CONTAINED_RULES, _SetupView(None, None, None, self, None), RuleContext())
        errors = [v for v in problems if v.severity == "error"]
        if errors:
            raise CommOverlapConfigError(errors, title="comm_overlap cannot be finalized")

    def setup(
        self, model_config: Any, optimizer_config: Any, ddp_config: Any, *, dist_config: Optional[Any] = None
    ) -> dict[str, EffectiveValue]:
        """Write every switch's effective value onto the megatron-core configs that read it.

        The values come from the resolution's own per-switch functions, evaluated on these three
        configs, this object and ``comm_overlap.data_parallel_size`` (the world size is not known
        here); ``dist_config`` gives the process-group backend (default: NCCL on GPUs). This object
        is not changed. A copy (``ddp.overlap_grad_reduce``, ...) that was set directly to another
        value is refused, not overwritten. The prerequisites are checked by ``cfg.validate()``.
        Returns each switch's value and why.
        """
        view = _SetupView(model_config, optimizer_config, ddp_config, copy.copy(self), dist_config or _NcclOnGpus())
        written = ownership.directly_written(view)
        values = resolve_overlap_values(view, RuleContext())
        trial = copy.deepcopy(view)
        apply_overlap_values(trial, values)
        problems = ownership.direct_write_violations(written, trial)
        if problems:
            raise CommOverlapConfigError(problems, title="comm_overlap.setup would overwrite values set directly")
        apply_overlap_values(view, values)
        ownership.remember_copies(view)
        return values


__all__ = [
    "BOOL_SWITCHES",
    "DEFAULT_BUCKET_SIZE",
    "OVERLAP_FIELDS",
    "OVERLAP_RULES",
    "CommOverlapConfig",
    "CommOverlapConfigError",
    "EffectiveValue",
    "OverlapField",
    "format_effective_values",
]


if __name__ == "__main__":
    from megatron.bridge.training.overlap.docs import main

    raise SystemExit(main())
