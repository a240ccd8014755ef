"""Typed dotted overrides and YAML round trip (omegaconf under the hood)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from megatron.bridge.models.qwen import Qwen3MoEModelProvider235B_A22B
from megatron.bridge.recipes.qwen import (
    qwen3_30b_a3b_pretrain_8gpu_config,
    qwen3_30b_a3b_pretrain_config,
    qwen3_235b_a22b_pretrain_config,
    qwen3_moe_tiny_pretrain_config,
)
from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.errors import OverrideError
from megatron.bridge.training.utils.omegaconf_utils import (
    apply_overrides,
    config_to_yaml,
    process_config_with_overrides,
)


@pytest.fixture
def cfg():
    return qwen3_30b_a3b_pretrain_config()


def _error_for(cfg, *overrides) -> OverrideError:
    with pytest.raises(OverrideError) as info:
        apply_overrides(cfg, list(overrides))
    return info.value


@pytest.mark.parametrize(
    "recipe",
    [
        qwen3_30b_a3b_pretrain_config,
        qwen3_30b_a3b_pretrain_8gpu_config,
        qwen3_235b_a22b_pretrain_config,
        qwen3_moe_tiny_pretrain_config,
    ],
)
def test_yaml_round_trip_gives_an_equal_config(recipe, tmp_path):
    """Every setting loads back as written; the copies load as their owners give them."""
    cfg = recipe()
    path = tmp_path / "cfg.yaml"
    cfg.to_yaml(path)
    loaded = ConfigContainer.from_yaml(path)
    cfg.validate(), loaded.validate()  # both write the effective values into their copies
    assert loaded == cfg
    assert type(loaded.model) is type(cfg.model)


@pytest.mark.parametrize("validated_first", [False, True], ids=["before-validate", "after-validate"])
def test_saved_config_holds_owners_only(cfg, tmp_path, validated_first):
    """A copy never appears in a saved config (so it cannot show a stale value); loading it derives
    the copies again from their owners."""
    import yaml

    cfg.comm_overlap.overlap_moe_expert_parallel_comm = True
    if validated_first:
        cfg.validate()
    data = yaml.safe_load(cfg.to_yaml())
    assert data["comm_overlap"]["overlap_moe_expert_parallel_comm"] is True
    assert data["mixed_precision"] == "bf16_mixed"
    for section, name in (
        ("model", "overlap_moe_expert_parallel_comm"),
        ("model", "bf16"),
        ("optimizer", "params_dtype"),
        ("ddp", "overlap_grad_reduce"),
    ):
        assert name not in data[section], f"{section}.{name}"
    path = tmp_path / "cfg.yaml"
    path.write_text(cfg.to_yaml())
    loaded = ConfigContainer.from_yaml(path).validate()
    assert loaded.model.overlap_moe_expert_parallel_comm is True and loaded.model.bf16 is True


def test_copies_left_to_the_user_are_saved(cfg):
    """``mixed_precision=null`` leaves the dtype flags to the user: they are owners then, and saved."""
    import yaml

    cfg = apply_overrides(cfg, ["mixed_precision=null", "model.bf16=true"])
    data = yaml.safe_load(cfg.to_yaml())
    assert data["mixed_precision"] is None and data["model"]["bf16"] is True


def test_dtype_and_callable_survive_the_round_trip(cfg, tmp_path):
    cfg = apply_overrides(
        cfg,
        ["model.activation_func=torch.nn.functional.gelu", "mixed_precision=null", "model.params_dtype=torch.bfloat16"],
    )
    path = tmp_path / "cfg.yaml"
    cfg.to_yaml(path)
    loaded = ConfigContainer.from_yaml(path)
    assert loaded.model.activation_func is F.gelu
    assert loaded.model.params_dtype is torch.bfloat16
    assert "activation_func: torch." in path.read_text()


def test_lambda_cannot_be_written_to_yaml(cfg):
    cfg.model.activation_func = lambda x: x
    with pytest.raises(OverrideError, match="lambda"):
        config_to_yaml(cfg)


@pytest.mark.parametrize(
    "text, expected",
    [("true", True), ("false", False), ("True", True), ("False", False), ("1", True), ("0", False)],
)
def test_bool_words_become_real_bools(cfg, text, expected):
    out = apply_overrides(cfg, [f"comm_overlap.overlap_moe_expert_parallel_comm={text}"])
    assert out.comm_overlap.overlap_moe_expert_parallel_comm is expected


@pytest.mark.parametrize("text", ["maybe", "2", "tru"])
def test_bad_bool_is_rejected(cfg, text):
    err = _error_for(cfg, f"model.moe_shared_expert_overlap={text}")
    assert "model.moe_shared_expert_overlap" in str(err) and "bool" in str(err)


def test_non_integer_for_int_field_names_key_value_and_type(cfg):
    err = _error_for(cfg, "model.num_layers=abc")
    text = str(err)
    assert "model.num_layers" in text and "'abc'" in text and "int" in text
    assert err.fields == {"model.num_layers"}


def test_unknown_key_suggests_closest_valid_keys(cfg):
    err = _error_for(cfg, "model.num_layer=4")
    assert "did you mean model.num_layers" in str(err)


def test_unknown_section_is_reported(cfg):
    err = _error_for(cfg, "modle.num_layers=4")
    assert "did you mean model" in str(err)


def test_null_for_optional_field(cfg):
    out = apply_overrides(cfg, ["model.moe_router_dtype=null", "checkpoint.save=null"])
    assert out.model.moe_router_dtype is None and out.checkpoint.save is None


def test_the_string_none_is_not_a_null_sentinel(cfg):
    err = _error_for(cfg, "model.moe_router_dtype=None")
    assert "'None'" in str(err) and "null" in str(err)
    assert apply_overrides(cfg, ["checkpoint.save=None"]).checkpoint.save == "None"


def test_null_for_required_field_is_rejected(cfg):
    err = _error_for(cfg, "train.train_iters=null")
    assert "train.train_iters" in str(err) and "null" in str(err)


def test_lists_are_typed(cfg):
    out = apply_overrides(cfg, ["logger.steady_state_window=[2,6]", "profiling.profile_ranks=[0,1]"])
    assert out.logger.steady_state_window == [2, 6] and out.profiling.profile_ranks == [0, 1]
    err = _error_for(cfg, "logger.steady_state_window=[a,b]")
    assert "logger.steady_state_window" in str(err)


def test_literal_field_rejects_values_outside_its_choices(cfg):
    assert apply_overrides(cfg, ["model.moe_token_dispatcher_type=flex"]).model.moe_token_dispatcher_type == "flex"
    err = _error_for(cfg, "model.moe_token_dispatcher_type=deepep")
    assert "'alltoall'" in str(err) and "'flex'" in str(err)


def test_override_under_a_none_subconfig_builds_it(cfg):
    cfg.comm_overlap = None
    out = apply_overrides(cfg, ["comm_overlap.overlap_moe_expert_parallel_comm=true"])
    assert out.comm_overlap.overlap_moe_expert_parallel_comm is True
    assert out.comm_overlap.delay_wgrad_compute is None


def test_all_errors_are_reported_at_once_and_input_is_unchanged(cfg):
    before = dataclasses.replace(cfg)
    err = _error_for(cfg, "model.num_layers=abc", "train.micro_batch_size=1.5", "model.bogus=1", "train.train_iters=7")
    assert len(err.violations) == 3
    assert isinstance(err, ValueError)
    assert cfg == before and cfg.train.train_iters == before.train.train_iters


def test_overrides_return_a_copy_and_record_provenance(cfg):
    out = apply_overrides(cfg, ["model.num_layers=4"], source="cli")
    assert out.model.num_layers == 4 and cfg.model.num_layers == 48
    assert out.provenance == {"model.num_layers": "cli"}


def test_yaml_first_then_cli(cfg, tmp_path):
    path = tmp_path / "over.yaml"
    path.write_text("model:\n  num_layers: 6\n  hidden_size: 1024\ntrain:\n  train_iters: 3\n")
    out = process_config_with_overrides(cfg, config_filepath=path, cli_overrides=["model.num_layers=4"])
    assert (out.model.num_layers, out.model.hidden_size, out.train.train_iters) == (4, 1024, 3)
    assert out.provenance["model.num_layers"] == "cli"
    assert out.provenance["model.hidden_size"] == "yaml"


def test_yaml_interpolation_is_resolved(cfg, tmp_path):
    path = tmp_path / "over.yaml"
    path.write_text(
        "train:\n  global_batch_size: 64\n  micro_batch_size: 2\n  train_iters: ${train.global_batch_size}\n"
    )
    out = process_config_with_overrides(cfg, config_filepath=path)
    assert out.train.train_iters == 64


def test_bad_yaml_file_errors_are_typed(cfg, tmp_path):
    with pytest.raises(OverrideError, match="not found"):
        process_config_with_overrides(cfg, config_filepath=tmp_path / "missing.yaml")
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(OverrideError, match="mapping"):
        process_config_with_overrides(cfg, config_filepath=listing)


def test_malformed_dotted_override_is_rejected(cfg):
    err = _error_for(cfg, "model.num_layers")
    assert "key.path=value" in str(err)


def test_target_switches_the_model_provider_class(cfg):
    out = apply_overrides(cfg, {"model": {"_target_": "megatron.bridge.models.qwen.Qwen3MoEModelProvider235B_A22B"}})
    assert type(out.model) is Qwen3MoEModelProvider235B_A22B
    err = _error_for(cfg, "model._target_=builtins.dict")
    assert "GPTModelProvider" in str(err)


def test_overridden_optimizer_config_rederives_its_fields(cfg):
    out = apply_overrides(cfg, ["optimizer.lr=0.001", "optimizer.params_dtype=bf16"])
    assert out.optimizer.lr == 0.001 and out.optimizer.params_dtype is torch.bfloat16
