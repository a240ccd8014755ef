"""Communication-overlap configuration (placeholder; full rules arrive with the validation issue)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(kw_only=True)
class CommOverlapConfig:
    """User-facing overlap switches. ``None`` means "let the framework decide"."""

    overlap_moe_expert_parallel_comm: Optional[bool] = None
    delay_wgrad_compute: Optional[bool] = None


def resolve_comm_overlap(cfg, ctx) -> list:
    """Apply overlap settings to the model/DDP/optimizer configs; return violations (placeholder)."""
    overlap = cfg.comm_overlap
    if overlap.overlap_moe_expert_parallel_comm is not None:
        cfg.model.overlap_moe_expert_parallel_comm = overlap.overlap_moe_expert_parallel_comm
    if overlap.delay_wgrad_compute is not None:
        cfg.model.delay_wgrad_compute = overlap.delay_wgrad_compute
        cfg.ddp.delay_wgrad_compute = overlap.delay_wgrad_compute
    return []
