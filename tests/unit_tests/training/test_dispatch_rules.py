"""Every torch-native dispatch rule has a passing and a failing case (table-driven, as the general rules)."""

import dataclasses

import pytest
from overlap_helpers import set_fields
from packaging.version import Version

from megatron.bridge.recipes.qwen import qwen3_30b_a3b_pretrain_config
from megatron.bridge.training.dispatch_rules import TORCH_NATIVE_DISPATCH_RULES
from megatron.bridge.training.errors import ConfigValidationError
from megatron.bridge.training.finalize import default_rule_context
from megatron.bridge.training.rules import check_rules

TE_ABSENT = dict(te_version=None)
TE_PRESENT = dict(te_version=Version("2.12.0"))


def _set(**changes):
    """A mutation for the table: dotted path -> value."""
    return lambda cfg: set_fields(cfg, changes)


M = "model."
# rule id -> (context facts, mutation that breaks the rule, mutation that satisfies it)
CASES = {
    "torch-native-dispatcher-known": (
        TE_ABSENT, _set(**{M + "torch_native_dispatcher": "fast"}), _set(**{M + "torch_native_dispatcher": "megatron"})),
    "torch-native-ep-transport-known": (
        TE_ABSENT, _set(**{M + "torch_native_ep_transport": "ib"}), _set(**{M + "torch_native_ep_transport": "nccl"})),
    "torch-native-dispatch-needs-torch-native-layers": (
        TE_PRESENT, _set(**{M + "torch_native_dispatcher": "sorted"}),
        _set(**{M + "torch_native_dispatcher": "sorted", M + "layer_spec": "torch_native"})),
    "sorted-dispatch-must-be-exact": (
        TE_ABSENT, _set(**{M + "torch_native_dispatcher": "sorted", M + "moe_expert_capacity_factor": 1.25}),
        _set(**{M + "torch_native_dispatcher": "sorted"})),
    "ep-transport-needs-sorted-ep-dispatch": (
        TE_ABSENT, _set(**{M + "torch_native_ep_transport": "nvshmem", M + "torch_native_dispatcher": "megatron"}),
        _set(**{M + "torch_native_ep_transport": "nvshmem"})),
    "nvshmem-blocks-in-range": (
        TE_ABSENT, _set(**{M + "torch_native_nvshmem_blocks": 12}), _set(**{M + "torch_native_nvshmem_blocks": 16})),
}


def test_every_dispatch_rule_has_cases():
    assert set(CASES) == {rule.id for rule in TORCH_NATIVE_DISPATCH_RULES}


def _violated_ids(cfg, facts):
    ctx = dataclasses.replace(default_rule_context(), **facts)
    return {v.rule for v in check_rules(TORCH_NATIVE_DISPATCH_RULES, cfg, ctx)}


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_negative_case_is_reported(rule_id):
    facts, breaks, _ = CASES[rule_id]
    assert rule_id in _violated_ids(breaks(qwen3_30b_a3b_pretrain_config()), facts)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_positive_case_passes(rule_id):
    facts, _, satisfies = CASES[rule_id]
    assert rule_id not in _violated_ids(satisfies(qwen3_30b_a3b_pretrain_config()), facts)


def test_validate_refuses_a_transport_that_would_have_no_effect():
    cfg = qwen3_30b_a3b_pretrain_config()
    cfg.model.expert_model_parallel_size = 1
    cfg.model.torch_native_ep_transport = "nccl"
    with pytest.raises(ConfigValidationError, match="ep-transport-needs-sorted-ep-dispatch"):
        cfg.validate()
