"""Effective overlap values: each switch's value, the layer that set it, and the reason.

:func:`resolve_overlap_values` is the one place computed defaults are decided: an explicit owner
value (``comm_overlap.<switch>``) wins, ``null`` is computed by the switch's ``compute`` function.
It reads owners only: the megatron-facing copies are outputs, written by :func:`apply_overlap_values`.
``finalize`` calls both once per resolution and hands the result to everything that reports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from megatron.bridge.training.config_stages.facts.overlap_fields import (
    COMPUTED,
    OVERLAP_FIELD_NAMES,
    OVERLAP_FIELDS,
    EffectiveValue,
)
from megatron.bridge.training.config_stages.schema.rule_base import RuleContext, read_field

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = [
    "COMPUTED",
    "EffectiveValue",
    "apply_overlap_values",
    "format_effective_values",
    "resolve_overlap_values",
    "switch_value",
]


def switch_value(cfg: ConfigContainer, name: str) -> Any:
    """``comm_overlap.<name>``; ``None`` also when ``comm_overlap`` itself is ``None`` (all unset)."""
    return None if cfg.comm_overlap is None else getattr(cfg.comm_overlap, name)


def _explicit(cfg: ConfigContainer, name: str) -> EffectiveValue | None:
    value = switch_value(cfg, name)
    if value is None:
        return None
    source = cfg.provenance.get(f"comm_overlap.{name}", "recipe")
    return EffectiveValue(name, value, source, "as resolved by finalize" if source == COMPUTED else "")


def resolve_overlap_values(cfg: ConfigContainer, ctx: RuleContext) -> dict[str, EffectiveValue]:
    """Every switch's effective value for the machine ``ctx`` describes; ``cfg`` is not changed."""
    effective = {name: found for name in OVERLAP_FIELD_NAMES if (found := _explicit(cfg, name)) is not None}
    for spec in OVERLAP_FIELDS:
        if spec.name not in effective:
            value, why = spec.compute(cfg, effective, ctx)
            effective[spec.name] = EffectiveValue(spec.name, value, COMPUTED, why)
    return {name: effective[name] for name in OVERLAP_FIELD_NAMES}


def apply_overlap_values(cfg: ConfigContainer, effective: dict[str, EffectiveValue]) -> None:
    """Write the effective values to the owners and their megatron-facing copies of ``cfg``.

    The owners then describe the resolved run; values the framework chose are recorded as
    ``computed`` in ``cfg.provenance``.
    """
    for spec in OVERLAP_FIELDS:
        chosen = effective[spec.name]
        setattr(cfg.comm_overlap, spec.name, chosen.value)
        for target in spec.targets:
            holder_path, _, field_name = target.rpartition(".")
            setattr(read_field(cfg, holder_path), field_name, chosen.value)
        if chosen.source == COMPUTED:
            cfg.provenance[chosen.key] = COMPUTED


def format_effective_values(effective: dict[str, EffectiveValue]) -> str:
    """One line per switch: ``comm_overlap.x = value  [source: detail]``."""
    width = max(len(v.key) for v in effective.values())
    lines = []
    for v in effective.values():
        detail = f": {v.detail}" if v.detail else ""
        lines.append(f"{v.key:<{width}} = {v.value!r}  [{v.source}{detail}]")
    return "\n".join(lines)
