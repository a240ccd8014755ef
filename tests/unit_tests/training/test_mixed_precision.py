"""``mixed_precision`` owns the precision flags; ``None`` means no recipe: the model's own flags stand."""

from __future__ import annotations

import pytest
import torch
from overlap_helpers import ep_overlap_cfg, set_fields

from megatron.bridge.training.config_stages.resolution.finalize import resolve_config
from megatron.bridge.training.config_stages.schema.rule_base import read_field
from megatron.bridge.training.errors import CommOverlapConfigError, ConfigValidationError
from megatron.bridge.training.mixed_precision import MIXED_PRECISION_RECIPES, PRECISION_TARGETS
from megatron.bridge.training.utils.omegaconf_utils import apply_overrides

FP32_FLAGS = {"model.bf16": False, "model.fp16": False, "optimizer.bf16": False, "optimizer.fp16": False}
BF16_FLAGS = {
    "model.bf16": True,
    "optimizer.bf16": True,
    "model.params_dtype": torch.bfloat16,
    "optimizer.params_dtype": torch.bfloat16,
}


def _own_precision(flags: dict):
    cfg = set_fields(ep_overlap_cfg(), {"comm_overlap.overlap_moe_expert_parallel_comm": False})
    return set_fields(cfg, {"mixed_precision": None, **flags})


@pytest.mark.parametrize("flags", [FP32_FLAGS, BF16_FLAGS], ids=["fp32", "bf16"])
def test_none_keeps_the_models_own_dtype_flags(flags) -> None:
    resolved = _own_precision(flags).validate(world_size=2)
    for dotted, value in flags.items():
        assert read_field(resolved, dotted) == value, dotted
    assert resolved.mixed_precision is None


@pytest.mark.parametrize("name", sorted(MIXED_PRECISION_RECIPES))
def test_a_recipe_sets_every_flag_it_owns(name) -> None:
    cfg = set_fields(
        ep_overlap_cfg(), {"mixed_precision": name, "comm_overlap.overlap_moe_expert_parallel_comm": False}
    )
    effective = resolve_config(cfg).effective
    recipe = MIXED_PRECISION_RECIPES[name]
    for target, attribute in PRECISION_TARGETS.items():
        value = getattr(recipe, attribute)
        if value is not None or target != "model.fp8_recipe":
            assert read_field(effective, target) == value, target


def test_null_is_accepted_by_overrides_and_then_the_flags_are_the_users() -> None:
    cfg = apply_overrides(
        ep_overlap_cfg(),
        [
            "mixed_precision=null",
            "model.bf16=true",
            "optimizer.bf16=true",
            "model.params_dtype=bf16",
            "optimizer.params_dtype=bf16",
        ],
    )
    assert cfg.mixed_precision is None and cfg.model.bf16 is True
    assert cfg.validate(world_size=2).model.params_dtype is torch.bfloat16


def test_own_flags_that_disagree_are_refused() -> None:
    with pytest.raises(ConfigValidationError) as info:
        _own_precision({"model.bf16": True}).validate(world_size=2)
    assert "own-precision-flags-agree" in {v.rule for v in info.value.violations}


def test_ep_overlap_reads_the_models_flags_without_a_recipe() -> None:
    cfg = set_fields(_own_precision(FP32_FLAGS), {"comm_overlap.overlap_moe_expert_parallel_comm": True})
    with pytest.raises(CommOverlapConfigError) as info:
        cfg.validate(world_size=2)
    assert [v.rule for v in info.value.violations] == ["ep-overlap-needs-bf16-or-fp16"]
    cfg = set_fields(_own_precision(BF16_FLAGS), {"comm_overlap.overlap_moe_expert_parallel_comm": True})
    assert cfg.validate(world_size=2).model.overlap_moe_expert_parallel_comm is True
