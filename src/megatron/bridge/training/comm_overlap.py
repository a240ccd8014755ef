"""Communication overlap: ``CommOverlapConfig``, the one owner of every overlap switch.

Set a switch here (``cfg.comm_overlap.overlap_moe_expert_parallel_comm = True``, or the dotted
override ``comm_overlap.overlap_moe_expert_parallel_comm=true``); ``None`` means "framework
decides". ``cfg.validate()`` resolves every switch once (an explicit value wins, ``None`` is
computed), writes the effective values to the megatron-core fields that read them
(``model.overlap_moe_expert_parallel_comm``, ``model.delay_wgrad_compute``, ``ddp.*``, ...: copies,
never inputs), and raises ``CommOverlapConfigError`` listing every unmet prerequisite.

The dataclass lives with the other sections in :mod:`megatron.bridge.training.config`; the parts,
one job each, in the stages of :mod:`megatron.bridge.training.config_stages`: the switches and their
computed defaults (``facts.overlap_fields``), the prerequisites (``rules.overlap_rules``), effective
values (``resolution.overlap_resolution``), the upstream ``finalize``/``setup`` calls
(``resolution.overlap_lifecycle``) and the docs page (``resolution.overlap_docs``;
``python -m megatron.bridge.training.comm_overlap --write-docs`` regenerates
``docs/training/communication-overlap.md``). Who owns which megatron-core field is in
:mod:`megatron.bridge.training.config_stages.facts.ownership`.

Scripts written for Megatron-Bridge call ``cfg.comm_overlap.finalize()`` and
``cfg.comm_overlap.setup(model, optimizer, ddp)`` themselves (or
``runtime_config_update(cfg)``): both are views of the same resolution, never a second one.
"""

from __future__ import annotations

from megatron.bridge.training.config import CommOverlapConfig
from megatron.bridge.training.config_stages.facts.overlap_fields import (
    BOOL_SWITCHES,
    DEFAULT_BUCKET_SIZE,
    OVERLAP_FIELDS,
    OverlapField,
)
from megatron.bridge.training.config_stages.resolution.overlap_resolution import EffectiveValue, format_effective_values
from megatron.bridge.training.config_stages.rules.overlap_rules import OVERLAP_RULES
from megatron.bridge.training.errors import CommOverlapConfigError

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
    from megatron.bridge.training.config_stages.resolution.overlap_docs import main

    raise SystemExit(main())
