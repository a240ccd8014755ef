"""Shared builders for the overlap tests: a small valid EP-overlap config and a rule context."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from packaging.version import Version

from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.config_stages.resolution.finalize import default_rule_context, resolve_config
from megatron.bridge.training.config_stages.schema.rule_base import Rule, RuleContext, check_rules, read_field

WORLD = 2


def ctx(**overrides: Any) -> RuleContext:
    """A CPU host without TE/DeepEP, torch 2.11, two ranks; override any fact."""
    facts: dict[str, Any] = dict(
        te_version=None,
        torch_version=Version("2.11"),
        world_size=WORLD,
        device_capability=None,
        device_name=None,
        cuda_available=False,
        packages={"deep_ep": False},
    )
    for key, value in overrides.items():
        facts[key] = Version(value) if key in ("te_version", "torch_version") and isinstance(value, str) else value
    return RuleContext(**facts)


def ep_overlap_cfg() -> ConfigContainer:
    """Tiny Qwen3-MoE (4 layers, 8 experts) on EP=2 with EP overlap on: valid as it stands."""
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.model.num_layers = 4
    cfg.model.expert_model_parallel_size = 2
    cfg.comm_overlap.overlap_moe_expert_parallel_comm = True
    return cfg


def violated_rule_ids(rules: tuple[Rule, ...], cfg: ConfigContainer, facts: dict[str, Any]) -> set[str]:
    """Ids of ``rules`` that ``cfg`` violates, on this machine's rule context with ``facts`` replaced."""
    context = dataclasses.replace(default_rule_context(), **facts)
    return {v.rule for v in check_rules(rules, cfg, context)}


def set_fields(cfg: ConfigContainer, values: dict[str, Any]) -> ConfigContainer:
    """Apply ``{"model.x": 1, ...}`` to ``cfg`` (in place) and return it."""
    for dotted, value in values.items():
        owner, _, name = dotted.rpartition(".")
        setattr(read_field(cfg, owner) if owner else cfg, name, value)
    return cfg


def overlap_violations(cfg: ConfigContainer, context: RuleContext | None = None):
    """The overlap violations (errors and warnings) of one resolution of ``cfg``."""
    report = resolve_config(cfg, ctx=context or ctx()).report
    return list(report.errors + report.notes)


def violated_ids(cfg: ConfigContainer, context: RuleContext | None = None) -> set[str]:
    """Rule ids of every overlap violation (errors and warnings)."""
    return {v.rule for v in overlap_violations(cfg, context)}


def finalize(cfg: ConfigContainer, context: RuleContext | None = None) -> ConfigContainer:
    """``cfg.finalize()`` with an explicit rule context."""
    return resolve_config(copy.deepcopy(cfg), ctx=context or ctx()).raise_for_errors().config
