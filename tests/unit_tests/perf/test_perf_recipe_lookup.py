"""Recipe lookup from -m/-mr/--task, GPU-count variants, layout fit and global-batch scaling."""

import pytest

from megatron.bridge.perf.harness.recipe_lookup import (
    RecipeLookupError,
    available_families,
    layout_problem,
    lookup_recipe,
    recipe_tasks,
    reference_num_gpus,
    scaled_global_batch_size,
)
from megatron.bridge.recipes.qwen import (
    qwen3_30b_a3b_pretrain_config,
    qwen3_235b_a22b_pretrain_config,
    qwen3_moe_tiny_pretrain_config,
)


@pytest.mark.parametrize(
    "mr, ng, name, gpu_specific",
    [
        ("qwen3_30b_a3b", 16, "qwen3_30b_a3b_pretrain_config", False),
        ("qwen3_30b_a3b", None, "qwen3_30b_a3b_pretrain_config", False),
        ("qwen3_30b_a3b", 8, "qwen3_30b_a3b_pretrain_8gpu_config", True),
        ("qwen3_235b_a22b", 256, "qwen3_235b_a22b_pretrain_config", False),
        ("qwen3_moe_tiny", 2, "qwen3_moe_tiny_pretrain_config", False),
    ],
)
def test_lookup(mr, ng, name, gpu_specific):
    choice = lookup_recipe("qwen", mr, "pretrain", ng)
    assert choice.function_name == name and choice.gpu_specific is gpu_specific
    assert choice.qualified_name == f"megatron.bridge.recipes.qwen.{name}"
    assert callable(choice.factory)


def test_families_are_packages_and_tasks_come_from_their_recipes():
    """A module beside the family packages (``recipes/recipe_arguments.py``) is no family, and its
    ``*_config`` helpers give ``--task`` nothing to offer."""
    assert available_families() == ["qwen"]
    assert recipe_tasks() == ("pretrain",)


def test_unknown_family_lists_families():
    with pytest.raises(RecipeLookupError, match=r"unknown model family 'llama'.*available: .*qwen"):
        lookup_recipe("llama", "llama3_8b", "pretrain")


@pytest.mark.parametrize("mr, task", [("qwen3_7b", "pretrain"), ("qwen3_30b_a3b", "sft")])
def test_unknown_recipe_lists_recipes(mr, task):
    with pytest.raises(RecipeLookupError) as exc:
        lookup_recipe("qwen", mr, task)
    text = str(exc.value)
    assert f"{mr}_{task}_config" in text
    assert "-mr qwen3_30b_a3b --task pretrain" in text and "-mr qwen3_moe_tiny --task pretrain" in text
    assert "only for -ng 8" in text


def test_reference_gpu_counts_from_recipes():
    assert reference_num_gpus(qwen3_30b_a3b_pretrain_config) == 16
    assert reference_num_gpus(qwen3_235b_a22b_pretrain_config) == 256
    assert reference_num_gpus(qwen3_moe_tiny_pretrain_config) == 1
    assert reference_num_gpus(lambda: None) is None  # unmarked: the layout's minimum is assumed


@pytest.mark.parametrize("ng", [16, 32, 48])
def test_layout_fits(ng):
    assert layout_problem(qwen3_30b_a3b_pretrain_config(), ng) is None


@pytest.mark.parametrize("ng", [8, 24, 2])
def test_layout_misfit_lists_sizes_that_fit(ng):
    text = layout_problem(qwen3_30b_a3b_pretrain_config(), ng)
    assert f"-ng {ng}" in text and "GPU counts that fit: 16, 32, 48, 64" in text


@pytest.mark.parametrize(
    "factory, ref, ng, expected",
    [
        (qwen3_30b_a3b_pretrain_config, 16, 16, 1024),
        (qwen3_30b_a3b_pretrain_config, 16, 32, 2048),
        (qwen3_30b_a3b_pretrain_config, 16, 64, 4096),
        (qwen3_moe_tiny_pretrain_config, None, 1, 8),
        (qwen3_moe_tiny_pretrain_config, None, 2, 16),
        (qwen3_235b_a22b_pretrain_config, 256, 256, 1024),
        (qwen3_235b_a22b_pretrain_config, 256, 512, 2048),
    ],
)
def test_global_batch_scales_with_data_parallel_size(factory, ref, ng, expected):
    cfg = factory()
    assert scaled_global_batch_size(cfg.train.global_batch_size, cfg, ref, cfg, ng) == expected


def test_scaling_uses_the_final_layout():
    recipe = qwen3_30b_a3b_pretrain_config()
    changed = qwen3_30b_a3b_pretrain_config()
    changed.model.tensor_model_parallel_size = 2  # DP halves at the same GPU count
    assert scaled_global_batch_size(1024, recipe, 16, changed, 16) == 512
