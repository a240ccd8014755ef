"""``runtime_config_update(cfg)``: the last step before initialisation in Megatron-Bridge scripts.

It records the data-parallel size on ``cfg.comm_overlap`` and resolves the config once
(``cfg.resolve()``): precision flags, every overlap switch, every rule. The megatron-core copies of
``cfg`` receive the effective values, exactly what ``cfg.resolve()`` alone would give them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from megatron.bridge.training.config_stages.facts.parallel_layout import data_parallel_size, layout_within
from megatron.bridge.training.config_stages.schema.rule_base import RuleContext

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer
    from megatron.bridge.training.config_stages.resolution.finalize import Resolution


def runtime_world_size() -> int:
    """The process group's size once it exists, else ``$WORLD_SIZE``, else 1 (one process)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def runtime_config_update(cfg: ConfigContainer, world_size: int | None = None) -> Resolution:
    """Write ``cfg.comm_overlap.data_parallel_size`` for ``world_size`` and resolve ``cfg`` once.

    ``world_size`` defaults to :func:`runtime_world_size`. A layout that does not divide it (or a
    parallel size out of range) writes nothing, and the resolution refuses the layout with its rule
    (``layout-divides-world-size``, ...). Raises the typed error listing every problem; returns the
    resolution.
    """
    world = runtime_world_size() if world_size is None else world_size
    dp = data_parallel_size(cfg, world) if layout_within(cfg, RuleContext(world_size=world)) else None
    if cfg.comm_overlap is not None and dp is not None:
        cfg.comm_overlap.data_parallel_size = dp
    return cfg.resolve(world_size=world)
