"""One record for a precision recipe: the recipe table holds ``MixedPrecisionConfig`` objects (the
object a user edits), shared and so read-only; every way to get one to edit gives a copy."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from operator import attrgetter
from typing import Any

import pytest
from overlap_helpers import ep_overlap_cfg, set_fields

from megatron.bridge.training.config_stages.facts.mixed_precision_targets import PRECISION_TARGETS
from megatron.bridge.training.config_stages.resolution.finalize import resolve_config
from megatron.bridge.training.config_stages.schema.mixed_precision_config import (
    MIXED_PRECISION_RECIPES,
    MixedPrecisionConfig,
    MixedPrecisionRecipe,
    get_mixed_precision_config,
)

EP_OVERLAP_OFF = {"comm_overlap.overlap_moe_expert_parallel_comm": False}

COPIES: dict[str, Callable[[Any], MixedPrecisionConfig]] = {
    "deepcopy": copy.deepcopy,
    "copy": copy.copy,
    "replace": dataclasses.replace,
    "from_name": lambda record: MixedPrecisionConfig.from_name(_name_of(record)),
}
"""Each way to take an editable copy of a table record."""


def _name_of(record: MixedPrecisionConfig) -> str:
    return next(name for name, value in MIXED_PRECISION_RECIPES.items() if value is record)


def test_the_old_record_name_is_the_one_class() -> None:
    assert MixedPrecisionRecipe is MixedPrecisionConfig


@pytest.mark.parametrize("name", sorted(MIXED_PRECISION_RECIPES))
def test_a_table_record_is_the_object_its_name_gives(name: str) -> None:
    record = MIXED_PRECISION_RECIPES[name]
    assert type(record) is MixedPrecisionConfig
    assert record == get_mixed_precision_config(name) == get_mixed_precision_config(name.replace("_", "-"))


@pytest.mark.parametrize("name", ["bf16_mixed", "nanov2_bf16_with_fp8_current_scaling_mixed"])
def test_a_table_record_refuses_an_edit_and_names_the_copy_to_edit(name: str) -> None:
    record = MIXED_PRECISION_RECIPES[name]
    with pytest.raises(dataclasses.FrozenInstanceError, match=rf"get_mixed_precision_config\('{name}'\)"):
        record.fp8 = "hybrid"
    assert record == get_mixed_precision_config(name)


@pytest.mark.parametrize("how", COPIES)
def test_a_copy_of_a_table_record_is_editable_and_leaves_the_table_alone(how: str) -> None:
    record = MIXED_PRECISION_RECIPES["bf16_mixed"]
    mine = COPIES[how](record)
    mine.fp8 = "hybrid"
    assert mine.fp8 == "hybrid" and record.fp8 is None


def test_a_table_record_as_the_setting_resolves_as_its_name_does() -> None:
    name = "bf16_with_fp8_current_scaling_mixed"
    by_name = resolve_config(set_fields(ep_overlap_cfg(), {"mixed_precision": name, **EP_OVERLAP_OFF}))
    record = MIXED_PRECISION_RECIPES[name]
    by_record = resolve_config(set_fields(ep_overlap_cfg(), {"mixed_precision": record, **EP_OVERLAP_OFF}))
    assert [v.rule for v in by_record.errors] == [v.rule for v in by_name.errors]  # the host's verdict, alike
    for target in PRECISION_TARGETS:
        assert attrgetter(target)(by_record.effective) == attrgetter(target)(by_name.effective), target
    assert record == get_mixed_precision_config(name)


@pytest.mark.parametrize("flags, dtype", [({"bf16": True}, "bfloat16"), ({"fp16": True}, "float16"), ({}, "float32")])
def test_as_recipe_decides_the_dtypes_on_a_copy(flags: dict, dtype: str) -> None:
    mine = MixedPrecisionConfig(**flags)
    recipe = mine.as_recipe()
    assert str(recipe.params_dtype) == str(recipe.pipeline_dtype) == f"torch.{dtype}"
    assert mine.params_dtype is None and mine.pipeline_dtype is None
