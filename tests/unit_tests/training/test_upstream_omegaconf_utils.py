"""Megatron-Bridge's override helpers: its tree form of callables, its excluded-field keys, its errors."""

from __future__ import annotations

import pytest
import torch
from megatron.core.activations import fast_gelu, squared_relu
from omegaconf import OmegaConf

from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.errors import OverrideError, OverridesError, Violation
from megatron.bridge.training.utils.omegaconf_utils import (
    apply_overrides,
    config_from_yaml,
    create_omegaconf_dict_config,
    load_yaml,
    process_config_with_overrides,
)


@pytest.fixture
def cfg() -> ConfigContainer:
    return qwen3_moe_tiny_pretrain_config()


@pytest.mark.parametrize(
    "fn, text", [(torch.nn.functional.silu, "silu"), (torch.nn.functional.gelu, "gelu"), (squared_relu, "squared_relu")]
)
def test_activation_function_is_written_by_its_short_name(cfg, fn, text) -> None:
    cfg.model.activation_func = fn
    tree, excluded = create_omegaconf_dict_config(cfg)
    assert tree.model.activation_func == text and "model.activation_func" not in excluded


@pytest.mark.parametrize(
    "text, fn",
    [
        ("silu", torch.nn.functional.silu),
        ("torch.nn.functional.silu", torch.nn.functional.silu),
        ("gelu", torch.nn.functional.gelu),
        ("relu2", squared_relu),
        ("gelu_pytorch_tanh", fast_gelu),
    ],
)
def test_both_spellings_of_an_activation_read_back(cfg, text, fn) -> None:
    tree, excluded = create_omegaconf_dict_config(cfg)
    tree.model.activation_func = text
    apply_overrides(cfg, OmegaConf.to_container(tree, resolve=True), excluded)
    assert cfg.model.activation_func is fn


def test_an_unchanged_tree_changes_nothing(cfg) -> None:
    tree, excluded = create_omegaconf_dict_config(cfg)
    apply_overrides(cfg, OmegaConf.to_container(tree, resolve=True), excluded)
    assert cfg.provenance == qwen3_moe_tiny_pretrain_config().provenance


@pytest.mark.parametrize("key", ["root.model.activation_func", "model.activation_func"])
def test_excluded_fields_with_or_without_the_root_prefix_are_restored(cfg, key) -> None:
    hook = lambda x: x  # noqa: E731 - no text form
    tree, _ = create_omegaconf_dict_config(cfg)
    cfg.model.activation_func = hook
    tree.train.train_iters = 7
    data = OmegaConf.to_container(tree)
    del data["model"]["activation_func"]
    apply_overrides(cfg, data, {key: hook})
    assert cfg.model.activation_func is hook and cfg.train.train_iters == 7


@pytest.mark.parametrize(
    "call",
    [lambda p: process_config_with_overrides(qwen3_moe_tiny_pretrain_config(), p), load_yaml, config_from_yaml],
    ids=["process_config_with_overrides", "load_yaml", "config_from_yaml"],
)
def test_a_missing_config_file_is_a_file_not_found_error(tmp_path, call) -> None:
    missing = tmp_path / "absent.yaml"
    with pytest.raises(FileNotFoundError, match="Config file not found") as info:  # Megatron-Bridge's sentence
        call(missing)
    assert isinstance(info.value, OverrideError) and str(missing) in str(info.value)
    assert [v.rule for v in info.value.violations] == ["yaml-missing"] and "fix:" in str(info.value)


def _yaml(tmp_path, text: str):
    path = tmp_path / "over.yaml"
    path.write_text(text)
    return path


# case -> (YAML text or None, dotted overrides, {field: value after})
IN_PLACE = {
    "overrides": (None, ["train.train_iters=7"], {"train_iters": 7, "global_batch_size": 8}),
    "file then overrides": (
        "train:\n  global_batch_size: 16\n",
        ["train.train_iters=7"],
        {"train_iters": 7, "global_batch_size": 16},
    ),
    "file only": ("train:\n  global_batch_size: 16\n", None, {"train_iters": 10, "global_batch_size": 16}),
}


@pytest.mark.parametrize("case", list(IN_PLACE))
def test_process_config_with_overrides_updates_the_config_it_was_given(tmp_path, case) -> None:
    """Megatron-Bridge's behaviour: the same object comes back, updated. All or nothing: a later
    call whose good file is followed by a bad override leaves it as it was."""
    text, overrides, expected = IN_PLACE[case]
    cfg = qwen3_moe_tiny_pretrain_config()
    result = process_config_with_overrides(cfg, _yaml(tmp_path, text) if text else None, overrides)
    assert result is cfg
    assert {name: getattr(cfg.train, name) for name in expected} == expected
    with pytest.raises(OverrideError):
        process_config_with_overrides(
            cfg, _yaml(tmp_path, "train:\n  global_batch_size: 32\n"), ["train.train_itres=9"]
        )
    assert {name: getattr(cfg.train, name) for name in expected} == expected


@pytest.mark.parametrize("cls", [OverridesError, OverrideError])
def test_an_error_built_from_a_message_keeps_it(cls) -> None:
    error = cls("Test")
    assert str(error) == "Test" and error.violations == []


def test_an_error_built_from_violations_lists_them() -> None:
    problem = Violation("r", ("a.b",), (1,), "bad", "fix it")
    error = OverridesError([problem], "invalid overrides")
    assert error.violations == [problem]
    assert str(error).startswith("invalid overrides: 1 problem(s)") and "fix: fix it" in str(error)
