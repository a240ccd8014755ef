"""The precision step of the resolution: the recipe's flags written onto the configs it drives."""

from __future__ import annotations

from typing import TYPE_CHECKING

from megatron.bridge.training.config_stages.facts.mixed_precision_targets import (
    LEFT_TO_USER,
    PRECISION_TARGETS,
    precision_value,
)

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer


def apply_mixed_precision(cfg: ConfigContainer) -> None:
    """Derive the precision flags of ``cfg.model``, ``cfg.optimizer`` and ``cfg.ddp`` from the name."""
    for target in PRECISION_TARGETS:
        value = precision_value(cfg.mixed_precision, target)
        if value is not LEFT_TO_USER:
            holder, _, name = target.rpartition(".")
            setattr(getattr(cfg, holder), name, value)
