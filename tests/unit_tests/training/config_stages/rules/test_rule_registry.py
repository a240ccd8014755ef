"""One registry of rules: the resolution checks exactly the registry, and every dispatch path's rules
are in it. (That every rule table is in the registry, each rule id once, is part of the source
layout's tests.)"""

from __future__ import annotations

from megatron.bridge.models.dispatch.path_registry import DISPATCH_PATHS, FLEX_BACKENDS, package_needs
from megatron.bridge.training.config_stages.resolution import finalize
from megatron.bridge.training.config_stages.rules.dispatch_path_rules import CONFIG_FACTS
from megatron.bridge.training.config_stages.rules.registry import ALL_RULES
from megatron.bridge.training.flex_dispatcher_backend import FLEX_BACKEND_SUPPORT


def test_the_resolution_checks_the_registry():
    assert finalize.ALL_RULES is ALL_RULES


def test_the_flex_backends_are_the_flex_paths_with_their_gpu_tables():
    assert tuple(FLEX_BACKEND_SUPPORT) == FLEX_BACKENDS == ("deepep", "hybridep", "ncclep")


def test_every_rule_of_every_dispatch_path_is_checked():
    registered = {rule.id for rule in ALL_RULES}
    for path in DISPATCH_PATHS:
        assert {rule.id for rule in path.rules(CONFIG_FACTS)} <= registered, path.name
    for need in package_needs():
        assert {need.rule_id, need.note_id} <= registered, need.module
