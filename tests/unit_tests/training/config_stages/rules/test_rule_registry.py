"""One registry of rules: the resolution checks exactly the registry, and the flex backend names are
defined once. (That every rule table is in the registry, each rule id once, is part of the source
layout's tests.)"""

from __future__ import annotations

from megatron.bridge.training.config_stages.resolution import finalize
from megatron.bridge.training.config_stages.rules.registry import ALL_RULES
from megatron.bridge.training.flex_dispatcher_backend import FLEX_BACKEND_SUPPORT
from megatron.bridge.utils.flex_backend_names import FLEX_BACKENDS


def test_the_resolution_checks_the_registry():
    assert finalize.ALL_RULES is ALL_RULES


def test_flex_backend_names_are_defined_once():
    assert tuple(FLEX_BACKEND_SUPPORT) == FLEX_BACKENDS
