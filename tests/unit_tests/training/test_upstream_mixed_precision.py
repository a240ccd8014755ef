"""Megatron-Bridge's precision recipe functions, names and lookup, on this package's one recipe table."""

from __future__ import annotations

import pytest
import torch
from overlap_helpers import ep_overlap_cfg, set_fields
from packaging.version import Version

from megatron.bridge.training import mixed_precision as mp
from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.config_stages.resolution.finalize import resolve_config
from megatron.bridge.training.config_stages.rules.mixed_precision_rules import PRECISION_RULES
from megatron.bridge.training.config_stages.schema.rule_base import RuleContext, check_rules
from megatron.bridge.training.errors import ConfigError, ConfigValidationError
from megatron.bridge.training.mixed_precision import MixedPrecisionConfig, get_mixed_precision_config

TE = Version("2.8")

# name -> the fields that tell the recipe apart
RECIPES = {
    "bf16_mixed": dict(bf16=True, fp16=False, params_dtype=torch.bfloat16, grad_reduce_in_fp32=True, fp8=None),
    "fp16_mixed": dict(bf16=False, fp16=True, params_dtype=torch.half, grad_reduce_in_fp32=False, fp8=None),
    "bf16_with_fp8_delayed_scaling_mixed": dict(
        bf16=True, fp8="hybrid", fp8_recipe="delayed", fp8_amax_history_len=1024, fp8_amax_compute_algo="max"
    ),
    "fp16_with_fp8_delayed_scaling_mixed": dict(
        fp16=True, fp8="hybrid", fp8_recipe="delayed", fp8_amax_history_len=1024, fp8_amax_compute_algo="max"
    ),
    "bf16_with_mxfp8_mixed": dict(bf16=True, fp8="e4m3", fp8_recipe="mxfp8"),
    "fp16_with_mxfp8_mixed": dict(fp16=True, fp8="e4m3", fp8_recipe="mxfp8"),
    "bf16_with_fp8_current_scaling_mixed": dict(
        bf16=True,
        fp8="hybrid",
        fp8_recipe="tensorwise",
        first_last_layers_bf16=True,
        num_layers_at_start_in_bf16=1,
        num_layers_at_end_in_bf16=1,
    ),
    "fp16_with_fp8_current_scaling_mixed": dict(
        fp16=True,
        fp8="hybrid",
        fp8_recipe="tensorwise",
        first_last_layers_bf16=True,
        num_layers_at_start_in_bf16=1,
        num_layers_at_end_in_bf16=1,
    ),
    "nemotron_h_bf16_with_fp8_current_scaling_mixed": dict(
        bf16=True, fp8="hybrid", fp8_recipe="tensorwise", num_layers_at_start_in_bf16=2, num_layers_at_end_in_bf16=2
    ),
    "nanov2_bf16_with_fp8_current_scaling_mixed": dict(
        bf16=True, fp8="hybrid", fp8_recipe="blockwise", num_layers_at_start_in_bf16=2, num_layers_at_end_in_bf16=2
    ),
    "bf16_with_fp8_subchannel_scaling_mixed": dict(bf16=True, fp8="hybrid", fp8_recipe="blockwise"),
    "fp16_with_fp8_subchannel_scaling_mixed": dict(fp16=True, fp8="hybrid", fp8_recipe="blockwise"),
    "bf16_with_nvfp4_mixed": dict(bf16=True, fp8=None, fp4="e2m1", fp4_recipe="nvfp4"),
    "nemotron_3_super_bf16_with_nvfp4_mixed": dict(
        bf16=True, fp8=None, fp4="e2m1", first_last_layers_bf16=True, num_layers_at_end_in_bf16=14
    ),
}


@pytest.mark.parametrize("name, expected", RECIPES.items(), ids=list(RECIPES))
def test_recipe_function_returns_a_new_config_with_its_values(name, expected) -> None:
    factory = getattr(mp, name)
    first, second = factory(), factory()
    assert isinstance(first, MixedPrecisionConfig) and first is not second
    first.bf16 = not first.bf16
    assert factory() == second
    assert {k: getattr(second, k) for k in expected} == expected


@pytest.mark.parametrize("name", list(RECIPES))
def test_name_and_hyphenated_name_give_the_recipe_function_s_config(name) -> None:
    expected = getattr(mp, name)()
    assert get_mixed_precision_config(name) == expected
    assert get_mixed_precision_config(name.replace("_", "-")) == expected


def test_a_config_object_is_returned_as_it_is() -> None:
    mine = MixedPrecisionConfig(bf16=True, grad_reduce_in_fp32=False)
    assert get_mixed_precision_config(mine) is mine


@pytest.mark.parametrize("name", ["bf16_mixd", "nope", ""])
def test_unknown_name_is_a_value_error_with_megatron_bridge_s_sentence(name) -> None:
    """Megatron-Bridge's sentence, verbatim, inside a typed error naming the field, value and fix."""
    with pytest.raises(ValueError, match="Unknown mixed-precision recipe") as info:
        get_mixed_precision_config(name)
    err = info.value
    assert isinstance(err, KeyError) and isinstance(err, ConfigError)
    assert [(v.rule, v.fields, v.values) for v in err.violations] == [
        ("mixed-precision-known", ("mixed_precision",), (name,))
    ]
    assert "Available recipes: bf16_mixed" in str(err) and "fix:" in str(err)


def test_unknown_name_in_a_config_is_reported_in_megatron_bridge_s_words() -> None:
    cfg = set_fields(ep_overlap_cfg(), {"mixed_precision": "bf17_mixed"})
    with pytest.raises(ValueError, match="Unknown mixed-precision recipe"):
        cfg.validate()


@pytest.mark.parametrize("name", list(RECIPES))
def test_the_recipe_table_answers_for_the_hyphenated_name(name) -> None:
    hyphenated = name.replace("_", "-")
    table = mp.MIXED_PRECISION_RECIPES
    assert hyphenated in table and table[hyphenated] is table[name] and table.get(hyphenated) is table[name]
    assert hyphenated not in list(table)  # each recipe is listed once, by its underscore name


# recipe name -> the pipeline dtype it sets (model.pipeline_dtype)
PIPELINE_DTYPES = {
    "bf16_mixed": torch.bfloat16,
    "fp16_mixed": torch.half,
    "bf16_with_fp8_current_scaling_mixed": torch.bfloat16,
    "fp16_with_mxfp8_mixed": torch.half,
}


@pytest.mark.parametrize("name, dtype", PIPELINE_DTYPES.items(), ids=list(PIPELINE_DTYPES))
def test_recipe_sets_the_pipeline_dtype(name, dtype) -> None:
    assert getattr(mp, name)().pipeline_dtype == dtype
    assert get_mixed_precision_config(name.replace("_", "-")).pipeline_dtype == dtype
    cfg = set_fields(
        ep_overlap_cfg(), {"mixed_precision": name, "comm_overlap.overlap_moe_expert_parallel_comm": False}
    )
    assert resolve_config(cfg).effective.model.pipeline_dtype == dtype


@pytest.mark.parametrize("pipeline_dtype, expected", [(None, torch.bfloat16), (torch.float32, torch.float32)])
def test_a_config_object_s_pipeline_dtype_reaches_the_model(pipeline_dtype, expected) -> None:
    """``None`` sends activations between stages in ``params_dtype``; a dtype given is used."""
    precision = MixedPrecisionConfig(bf16=True, pipeline_dtype=pipeline_dtype)
    cfg = set_fields(
        ep_overlap_cfg(), {"mixed_precision": precision, "comm_overlap.overlap_moe_expert_parallel_comm": False}
    )
    assert resolve_config(cfg).effective.model.pipeline_dtype == expected


@pytest.mark.parametrize("name", ["bf16-mixed", "nemotron_h_bf16_with_fp8_current_scaling_mixed"])
def test_setting_a_name_writes_the_recipe_into_the_model(name) -> None:
    cfg = set_fields(
        ep_overlap_cfg(), {"mixed_precision": name, "comm_overlap.overlap_moe_expert_parallel_comm": False}
    )
    model = resolve_config(cfg).effective.model
    recipe = get_mixed_precision_config(name)
    assert (model.bf16, model.first_last_layers_bf16, model.num_layers_at_end_in_bf16) == (
        recipe.bf16,
        recipe.first_last_layers_bf16,
        recipe.num_layers_at_end_in_bf16,
    )


@pytest.mark.parametrize(
    "ctx, rule",
    [
        (RuleContext(te_version=None), "fp4-needs-transformer-engine"),
        (RuleContext(te_version=TE, device_capability=(9, 0)), "fp4-needs-blackwell"),
    ],
    ids=["no-te", "hopper"],
)
def test_fp4_recipe_is_refused_where_it_cannot_run(ctx, rule) -> None:
    cfg = set_fields(
        ep_overlap_cfg(),
        {"mixed_precision": "bf16_with_nvfp4_mixed", "comm_overlap.overlap_moe_expert_parallel_comm": False},
    )
    effective = resolve_config(cfg).effective
    assert effective.model.fp4 == "e2m1"
    assert rule in {v.rule for v in check_rules(PRECISION_RULES, effective, ctx)}
    blackwell = RuleContext(te_version=ctx.te_version or TE, device_capability=(10, 0))
    assert check_rules(PRECISION_RULES, effective, blackwell) == []


# Megatron-Bridge's MixedPrecisionConfig fields that have nothing to act on here, at the only value accepted.
UNOFFERED_AT_WHAT_RUNS = {
    "autocast_enabled": False,
    "autocast_dtype": None,
    "fp8_param": False,
    "fp8_param_gather": False,
}
EP_OVERLAP_OFF = {"comm_overlap.overlap_moe_expert_parallel_comm": False}


@pytest.mark.parametrize("name", list(RECIPES))
def test_every_recipe_carries_the_unoffered_fields_at_what_runs_and_validates_with_them(name) -> None:
    precision = getattr(mp, name)()
    assert {field: getattr(precision, field) for field in UNOFFERED_AT_WHAT_RUNS} == UNOFFERED_AT_WHAT_RUNS
    cfg = set_fields(ep_overlap_cfg(), {"mixed_precision": precision, **EP_OVERLAP_OFF})
    refused = {v.rule for v in resolve_config(cfg).errors}
    assert not refused & {"autocast-not-offered", "fp8-param-not-offered"}


@pytest.mark.parametrize(
    "field, value, rule",
    [
        ("autocast_enabled", True, "autocast-not-offered"),
        ("autocast_dtype", torch.bfloat16, "autocast-not-offered"),
        ("fp8_param", True, "fp8-param-not-offered"),
        ("fp8_param_gather", True, "fp8-param-not-offered"),
    ],
)
def test_an_unoffered_precision_setting_is_refused_by_validate_naming_field_and_value(field, value, rule) -> None:
    precision = MixedPrecisionConfig(bf16=True, **{field: value})
    cfg = set_fields(ep_overlap_cfg(), {"mixed_precision": precision, **EP_OVERLAP_OFF})
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate()
    assert [v.rule for v in info.value.violations] == [rule]
    assert f"mixed_precision.{field}={value!r}" in str(info.value) and "fix:" in str(info.value)


def test_a_precision_object_keeps_the_unoffered_fields_through_yaml(tmp_path) -> None:
    cfg = set_fields(ep_overlap_cfg(), {"mixed_precision": mp.bf16_mixed(), **EP_OVERLAP_OFF})
    cfg.to_yaml(tmp_path / "run.yaml")
    loaded = ConfigContainer.from_yaml(tmp_path / "run.yaml")
    assert {field: getattr(loaded.mixed_precision, field) for field in UNOFFERED_AT_WHAT_RUNS} == UNOFFERED_AT_WHAT_RUNS
