"""One registry of rules: every rule table the package defines is in it, each rule id once, and the
resolution checks exactly the registry."""

from __future__ import annotations

import importlib
import pkgutil
from collections import Counter

import megatron.bridge
from megatron.bridge.training.resolution import finalize
from megatron.bridge.training.flex_dispatcher_backend import FLEX_BACKEND_SUPPORT
from megatron.bridge.training.rules.registry import ALL_RULES
from megatron.bridge.training.rules.core import Rule
from megatron.bridge.utils.flex_backend_names import FLEX_BACKENDS


def _rule_tables() -> dict[str, tuple[Rule, ...]]:
    """``module.NAME`` -> every module-level tuple of rules in the package."""
    tables = {}
    for info in pkgutil.walk_packages(megatron.bridge.__path__, "megatron.bridge."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, tuple) and value and all(isinstance(r, Rule) for r in value):
                tables[f"{info.name}.{name}"] = value
    return tables


def test_every_rule_table_is_in_the_registry():
    registered = {id(rule) for rule in ALL_RULES}
    missing = {name: [r.id for r in table if id(r) not in registered] for name, table in _rule_tables().items()}
    assert not {k: v for k, v in missing.items() if v}, missing


def test_rule_ids_are_unique():
    assert [rule_id for rule_id, n in Counter(r.id for r in ALL_RULES).items() if n > 1] == []


def test_the_resolution_checks_the_registry():
    assert finalize.ALL_RULES is ALL_RULES


def test_flex_backend_names_are_defined_once():
    assert tuple(FLEX_BACKEND_SUPPORT) == FLEX_BACKENDS
