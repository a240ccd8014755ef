"""Megatron-Bridge's ``comm_overlap.finalize()`` and ``comm_overlap.setup(...)``: views of the one
resolution, evaluated on the pieces a script hands over instead of on a whole container."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from megatron.bridge.training.config_stages.facts import ownership
from megatron.bridge.training.config_stages.resolution.overlap_resolution import (
    EffectiveValue,
    apply_overlap_values,
    resolve_overlap_values,
)
from megatron.bridge.training.config_stages.rules.overlap_rules import OVERLAP_RULES
from megatron.bridge.training.config_stages.schema.rule_base import RuleContext, check_rules
from megatron.bridge.training.errors import CommOverlapConfigError

if TYPE_CHECKING:
    from megatron.bridge.training.config import CommOverlapConfig, ConfigContainer

_SELF_CONTAINED_RULE_IDS = frozenset({"tp-comm-bootstrap-backend-known", "data-parallel-size-matches-layout"})
_SELF_CONTAINED_RULES = tuple(r for r in OVERLAP_RULES if r.group == "types" or r.id in _SELF_CONTAINED_RULE_IDS)
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


def _as_container(view: _SetupView) -> ConfigContainer:
    """``view`` where the rules and the overlap resolution take a container: it has the sections they
    read (duck-typed on purpose: ``finalize``/``setup`` are given sections, not a container), and the
    ownership records skip the ones it lacks."""
    return cast("ConfigContainer", view)


def finalize_switches(overlap: CommOverlapConfig) -> None:
    """``CommOverlapConfig.finalize()``: the self-contained rules, every error raised at once."""
    problems = check_rules(
        _SELF_CONTAINED_RULES, _as_container(_SetupView(None, None, None, overlap, None)), RuleContext()
    )
    errors = [v for v in problems if v.severity == "error"]
    if errors:
        raise CommOverlapConfigError(errors, title="comm_overlap cannot be finalized")


def setup_switches(
    overlap: CommOverlapConfig,
    model_config: Any,
    optimizer_config: Any,
    ddp_config: Any,
    dist_config: Any | None,
) -> dict[str, EffectiveValue]:
    """``CommOverlapConfig.setup(...)``: the effective values written onto the three configs."""
    view = _as_container(
        _SetupView(model_config, optimizer_config, ddp_config, copy.copy(overlap), dist_config or _NcclOnGpus())
    )
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
