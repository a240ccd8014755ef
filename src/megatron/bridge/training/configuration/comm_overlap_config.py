"""``CommOverlapConfig``: the section that owns every communication-overlap switch.

A dataclass with no resolution in it, so that importing the configuration stays light. Its two
upstream lifecycle calls, ``finalize()`` and ``setup()``, are carried out by
:mod:`megatron.bridge.training.overlap.lifecycle`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from megatron.bridge.utils.strict_fields import StrictFields

if TYPE_CHECKING:
    from megatron.bridge.training.overlap.overlap_resolution import EffectiveValue


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
        # Deferred: the overlap rules and resolution are what importing a config must not load.
        from megatron.bridge.training.overlap.lifecycle import finalize_switches

        finalize_switches(self)

    def setup(
        self, model_config: Any, optimizer_config: Any, ddp_config: Any, *, dist_config: Optional[Any] = None
    ) -> "dict[str, EffectiveValue]":
        """Write every switch's effective value onto the megatron-core configs that read it.

        The values come from the resolution's own per-switch functions, evaluated on these three
        configs, this object and ``comm_overlap.data_parallel_size`` (the world size is not known
        here); ``dist_config`` gives the process-group backend (default: NCCL on GPUs). This object
        is not changed. A copy (``ddp.overlap_grad_reduce``, ...) that was set directly to another
        value is refused, not overwritten. The prerequisites are checked by ``cfg.validate()``.
        Returns each switch's value and why.
        """
        # Deferred, as in finalize().
        from megatron.bridge.training.overlap.lifecycle import setup_switches

        return setup_switches(self, model_config, optimizer_config, ddp_config, dist_config)
