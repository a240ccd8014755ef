"""The recipes take Megatron-Bridge's keyword arguments: each one has its effect, or is refused by name.

Every case calls a real recipe function. ``APPLIED_CASES`` and ``REFUSED_CASES`` together cover every
argument name the recipes accept (``recipe_arguments.ACCEPTED``); a new name needs a row here.
"""

from __future__ import annotations

import pytest
import torch

from megatron.bridge.recipes import recipe_arguments
from megatron.bridge.recipes.qwen import (
    qwen3_30b_a3b_pretrain_8gpu_config,
    qwen3_30b_a3b_pretrain_config,
    qwen3_235b_a22b_pretrain_config,
    qwen3_moe_tiny_pretrain_config,
)
from megatron.bridge.training.comm_overlap import CommOverlapConfig
from megatron.bridge.training.config_stages.schema.rule_base import read_field
from megatron.bridge.training.errors import ArgumentError, ConfigError

OVERLAP = CommOverlapConfig(overlap_moe_expert_parallel_comm=False, delay_wgrad_compute=False)

# case -> (recipe, keyword arguments, {dotted field: expected value})
APPLIED_CASES = {
    "mock": (qwen3_moe_tiny_pretrain_config, dict(mock=True), {"dataset.data_paths": None}),
    "data_paths": (qwen3_moe_tiny_pretrain_config, dict(data_paths=["/data/a"]), {"dataset.data_paths": ["/data/a"]}),
    "train_iters": (
        qwen3_moe_tiny_pretrain_config,
        dict(train_iters=40),
        {"train.train_iters": 40, "scheduler.lr_decay_iters": 40, "scheduler.lr_warmup_iters": 4},
    ),
    "lr_warmup_iters": (
        qwen3_moe_tiny_pretrain_config,
        dict(train_iters=40, lr_warmup_iters=7),
        {"scheduler.lr_warmup_iters": 7, "scheduler.lr_decay_iters": 40},
    ),
    "lr_decay_iters": (qwen3_moe_tiny_pretrain_config, dict(lr_decay_iters=9), {"scheduler.lr_decay_iters": 9}),
    "global_batch_size": (qwen3_moe_tiny_pretrain_config, dict(global_batch_size=16), {"train.global_batch_size": 16}),
    "micro_batch_size": (qwen3_moe_tiny_pretrain_config, dict(micro_batch_size=2), {"train.micro_batch_size": 2}),
    "seq_length": (qwen3_moe_tiny_pretrain_config, dict(seq_length=64), {"model.seq_length": 64}),
    "lr": (qwen3_moe_tiny_pretrain_config, dict(lr=5e-4), {"optimizer.lr": 5e-4}),
    "min_lr": (qwen3_moe_tiny_pretrain_config, dict(min_lr=5e-6), {"optimizer.min_lr": 5e-6}),
    "tensor_model_parallel_size": (
        qwen3_30b_a3b_pretrain_config,
        dict(tensor_model_parallel_size=2),
        {"model.tensor_model_parallel_size": 2, "model.sequence_parallel": True},
    ),
    "sequence_parallel": (
        qwen3_30b_a3b_pretrain_8gpu_config,
        dict(sequence_parallel=False),
        {"model.sequence_parallel": False, "model.tensor_model_parallel_size": 4},
    ),
    "pipeline_model_parallel_size": (
        qwen3_30b_a3b_pretrain_config,
        dict(pipeline_model_parallel_size=2),
        {"model.pipeline_model_parallel_size": 2},
    ),
    "virtual_pipeline_model_parallel_size": (
        qwen3_30b_a3b_pretrain_8gpu_config,
        dict(virtual_pipeline_model_parallel_size=2),
        {"model.virtual_pipeline_model_parallel_size": 2},
    ),
    "context_parallel_size": (
        qwen3_30b_a3b_pretrain_config,
        dict(context_parallel_size=2),
        {"model.context_parallel_size": 2},
    ),
    "expert_model_parallel_size": (
        qwen3_30b_a3b_pretrain_config,
        dict(expert_model_parallel_size=8),
        {"model.expert_model_parallel_size": 8},
    ),
    "expert_tensor_parallel_size": (
        qwen3_30b_a3b_pretrain_config,
        dict(expert_tensor_parallel_size=2),
        {"model.expert_tensor_parallel_size": 2},
    ),
    "account_for_embedding_in_pipeline_split": (
        qwen3_30b_a3b_pretrain_config,
        dict(account_for_embedding_in_pipeline_split=True),
        {"model.account_for_embedding_in_pipeline_split": True},
    ),
    "account_for_loss_in_pipeline_split": (
        qwen3_30b_a3b_pretrain_config,
        dict(account_for_loss_in_pipeline_split=True),
        {"model.account_for_loss_in_pipeline_split": True},
    ),
    "enable_recompute": (
        qwen3_30b_a3b_pretrain_config,
        dict(enable_recompute=True),
        {"model.recompute_granularity": "full", "model.recompute_method": "uniform", "model.recompute_num_layers": 1},
    ),
    "save_interval": (qwen3_moe_tiny_pretrain_config, dict(save_interval=5), {"checkpoint.save_interval": 5}),
    "precision_config": (
        qwen3_moe_tiny_pretrain_config,
        dict(precision_config="fp16_mixed"),
        {"mixed_precision": "fp16_mixed"},
    ),
    "precision_config=None": (
        qwen3_moe_tiny_pretrain_config,
        dict(precision_config=None),
        {"mixed_precision": "bf16_mixed"},
    ),
    "pipeline_dtype": (
        qwen3_moe_tiny_pretrain_config,
        dict(pipeline_dtype=torch.float32),
        {"mixed_precision.pipeline_dtype": torch.float32, "mixed_precision.bf16": True},
    ),
    "comm_overlap_config": (
        qwen3_moe_tiny_pretrain_config,
        dict(comm_overlap_config=OVERLAP),
        {"comm_overlap": OVERLAP},
    ),
    "moe_flex_dispatcher_backend": (
        qwen3_30b_a3b_pretrain_config,
        dict(moe_flex_dispatcher_backend="deepep"),
        {"model.moe_token_dispatcher_type": "flex", "model.moe_flex_dispatcher_backend": "deepep"},
    ),
    "use_null_tokenizer=True": (
        qwen3_30b_a3b_pretrain_config,
        dict(use_null_tokenizer=True),
        {"tokenizer.tokenizer_type": "NullTokenizer"},
    ),
    "use_null_tokenizer=False": (
        qwen3_235b_a22b_pretrain_config,
        dict(use_null_tokenizer=False),
        {"tokenizer.tokenizer_type": "HuggingFaceTokenizer", "tokenizer.tokenizer_model": "Qwen/Qwen3-235B-A22B"},
    ),
    "hf_path": (
        qwen3_30b_a3b_pretrain_config,
        dict(hf_path="Qwen/Qwen3-30B-A3B", use_null_tokenizer=False),
        {"tokenizer.tokenizer_model": "Qwen/Qwen3-30B-A3B"},
    ),
    # Accepted at their "off" value, which is what runs here.
    "use_megatron_fsdp=False": (
        qwen3_moe_tiny_pretrain_config,
        dict(use_megatron_fsdp=False),
        {"optimizer.use_distributed_optimizer": True},
    ),
    "eval_interval=None": (qwen3_moe_tiny_pretrain_config, dict(eval_interval=None), {"train.eval_interval": None}),
    "train_data_path=None": (qwen3_moe_tiny_pretrain_config, dict(train_data_path=None), {"dataset.data_paths": None}),
}


@pytest.mark.parametrize("case", list(APPLIED_CASES))
def test_argument_sets_the_fields_it_stands_for(case) -> None:
    recipe, kwargs, expected = APPLIED_CASES[case]
    cfg = recipe(**kwargs)
    assert {field: read_field(cfg, field) for field in expected} == expected


def test_dir_and_name_give_the_run_directory(tmp_path) -> None:
    """``<dir>/<name>/checkpoints`` is saved to, and loaded from once it exists (a rerun resumes)."""
    cfg = qwen3_moe_tiny_pretrain_config(dir=str(tmp_path), name="run1")
    checkpoints = tmp_path / "run1" / "checkpoints"
    assert (cfg.checkpoint.save, cfg.checkpoint.load, cfg.logger.log_dir) == (
        str(checkpoints),
        None,
        str(tmp_path / "run1"),
    )
    checkpoints.mkdir(parents=True)
    assert qwen3_moe_tiny_pretrain_config(dir=str(tmp_path), name="run1").checkpoint.load == str(checkpoints)


def test_name_without_dir_is_under_the_working_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = qwen3_moe_tiny_pretrain_config(name="exp")
    assert cfg.checkpoint.save == str(tmp_path / recipe_arguments.DEFAULT_BASE_DIR / "exp" / "checkpoints")


def test_pipeline_dtype_reaches_the_model_and_leaves_the_callers_precision_object_alone() -> None:
    from megatron.bridge.training.mixed_precision import bf16_mixed

    mine = bf16_mixed()
    cfg = qwen3_moe_tiny_pretrain_config(precision_config=mine, pipeline_dtype=torch.float32)
    cfg.dist.device = "cpu"
    assert cfg.validate().model.pipeline_dtype == torch.float32
    assert mine.pipeline_dtype == torch.bfloat16


def test_a_script_s_recipe_call_validates() -> None:
    """A call as a script makes it; the recipe keeps its name and the GPU count the harness reads."""
    cfg = qwen3_moe_tiny_pretrain_config(mock=True, train_iters=20, global_batch_size=4, micro_batch_size=1)
    cfg.dist.device = "cpu"
    resolved = cfg.validate()
    assert (resolved.train.train_iters, resolved.scheduler.lr_warmup_iters) == (20, 2)
    assert qwen3_moe_tiny_pretrain_config.__name__ == "qwen3_moe_tiny_pretrain_config"
    assert qwen3_30b_a3b_pretrain_config.reference_num_gpus == 16


# case -> (recipe, keyword arguments, the rule ids reported)
REFUSED_CASES = {
    "data_args_path": (
        qwen3_moe_tiny_pretrain_config,
        dict(data_args_path="args.txt"),
        ["recipe-argument-data-args-path"],
    ),
    "per_split_data_args_path": (
        qwen3_moe_tiny_pretrain_config,
        dict(per_split_data_args_path="s.json"),
        ["recipe-argument-per-split-data-args-path"],
    ),
    "train_data_path": (
        qwen3_moe_tiny_pretrain_config,
        dict(train_data_path=["/d/t"]),
        ["recipe-argument-train-data-path"],
    ),
    "valid_data_path": (
        qwen3_moe_tiny_pretrain_config,
        dict(valid_data_path=["/d/v"]),
        ["recipe-argument-valid-data-path"],
    ),
    "test_data_path": (
        qwen3_moe_tiny_pretrain_config,
        dict(test_data_path=["/d/t"]),
        ["recipe-argument-test-data-path"],
    ),
    "use_megatron_fsdp": (
        qwen3_moe_tiny_pretrain_config,
        dict(use_megatron_fsdp=True),
        ["recipe-argument-use-megatron-fsdp"],
    ),
    "eval_interval": (qwen3_moe_tiny_pretrain_config, dict(eval_interval=500), ["recipe-argument-eval-interval"]),
    "mock with data_paths": (
        qwen3_moe_tiny_pretrain_config,
        dict(mock=True, data_paths=["/d/a"]),
        ["recipe-argument-mock"],
    ),
    "mock=False without data": (qwen3_moe_tiny_pretrain_config, dict(mock=False), ["recipe-argument-mock"]),
    "mock as a string": (qwen3_moe_tiny_pretrain_config, dict(mock="false"), ["recipe-argument-mock"]),
    "hf_path of another model": (
        qwen3_30b_a3b_pretrain_config,
        dict(hf_path="Qwen/Qwen3-8B"),
        ["recipe-argument-hf-path"],
    ),
    "tiny recipe's Hugging Face tokenizer": (
        qwen3_moe_tiny_pretrain_config,
        dict(use_null_tokenizer=False),
        ["recipe-argument-use-null-tokenizer"],
    ),
    "a misspelt name": (qwen3_moe_tiny_pretrain_config, dict(trian_iters=3), ["recipe-argument-trian-iters"]),
    "several at once": (
        qwen3_moe_tiny_pretrain_config,
        dict(eval_interval=5, use_megatron_fsdp=True),
        ["recipe-argument-eval-interval", "recipe-argument-use-megatron-fsdp"],
    ),
}


@pytest.mark.parametrize("case", list(REFUSED_CASES))
def test_argument_that_cannot_work_is_refused_by_name(case) -> None:
    recipe, kwargs, rules = REFUSED_CASES[case]
    with pytest.raises(ArgumentError) as info:
        recipe(**kwargs)
    err = info.value
    assert isinstance(err, TypeError) and isinstance(err, ConfigError)
    assert [v.rule for v in err.violations] == rules
    assert all(v.fields[0] in kwargs for v in err.violations) and "fix:" in str(err)


def test_a_misspelt_name_gets_the_closest_names() -> None:
    with pytest.raises(ArgumentError, match="did you mean train_iters"):
        qwen3_moe_tiny_pretrain_config(trian_iters=3)


def test_positional_arguments_are_refused() -> None:
    with pytest.raises(ArgumentError, match="keyword arguments only"):
        qwen3_moe_tiny_pretrain_config(True)


def test_every_accepted_name_has_a_case() -> None:
    covered = {name for _, kwargs, _ in APPLIED_CASES.values() for name in kwargs}
    covered |= {name for _, kwargs, _ in REFUSED_CASES.values() for name in kwargs}
    assert set(recipe_arguments.ACCEPTED) <= covered | {"dir", "name"}
