"""Rules as data, as the configuration's stages import them: the ``Rule`` record, the ``RuleContext``
of machine facts and the checker, defined in :mod:`megatron.bridge.utils.rule_records` (below every
other layer, so that a dispatch path in ``models/dispatch/`` declares its own rules)."""

from megatron.bridge.utils.rule_records import (
    RANGE_PREFIX,
    TE_VERSION_VALUE,
    Rule,
    RuleContext,
    check_rules,
    field_default,
    read_field,
    te_version_text,
)

__all__ = [
    "RANGE_PREFIX",
    "TE_VERSION_VALUE",
    "Rule",
    "RuleContext",
    "check_rules",
    "field_default",
    "read_field",
    "te_version_text",
]
