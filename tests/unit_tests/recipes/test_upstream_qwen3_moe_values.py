"""The Qwen3-MoE recipes carry Megatron-Bridge's pretraining values on the fields both projects have,
and the values they leave different (optional packages) are the ones that run without them."""

import pytest
import torch

from megatron.bridge.recipes.qwen import (
    qwen3_30b_a3b_pretrain_8gpu_config,
    qwen3_30b_a3b_pretrain_config,
    qwen3_235b_a22b_pretrain_config,
)
from megatron.bridge.training.config_stages.schema.rule_base import read_field
from megatron.bridge.training.loop.builders import build_scheduler

# (recipe, GPUs its layout is written for)
UPSTREAM_RECIPES = [
    (qwen3_30b_a3b_pretrain_config, 16),
    (qwen3_30b_a3b_pretrain_8gpu_config, 8),
    (qwen3_235b_a22b_pretrain_config, 256),
]

# Megatron-Bridge's values for the published Qwen3-MoE pretraining recipes.
UPSTREAM_VALUES = {
    "train.train_iters": 300_000,
    "scheduler.lr_warmup_iters": 500,
    "scheduler.lr_warmup_init": 0.0,
    "scheduler.lr_decay_style": "cosine",
    "scheduler.start_weight_decay": 0.033,
    "scheduler.end_weight_decay": 0.033,
    "scheduler.weight_decay_incr_style": "constant",
    "optimizer.weight_decay": 0.1,
    "optimizer.adam_beta1": 0.9,
    "optimizer.adam_beta2": 0.95,
    "optimizer.adam_eps": 1e-5,
    "optimizer.clip_grad": 1.0,
    "train.manual_gc": True,
    "train.manual_gc_interval": 100,
    "model.seq_length": 4096,
    "dataset.seq_length": 4096,
    "model.vocab_size": 151936,
    "model.moe_shared_expert_overlap": False,
    "model.moe_router_force_load_balancing": False,
    "comm_overlap.overlap_moe_expert_parallel_comm": None,
    "comm_overlap.delay_wgrad_compute": None,
}

# Values kept so the recipe runs without an optional package (TE, DeepEP/HybridEP, a download).
RUNS_WITHOUT_OPTIONAL_PACKAGES = {
    "tokenizer.tokenizer_type": "NullTokenizer",
    "tokenizer.tokenizer_model": None,
    "model.moe_token_dispatcher_type": "alltoall",
    "model.moe_flex_dispatcher_backend": None,
    "model.moe_hybridep_num_sms": None,
    "model.moe_permute_fusion": False,
    "model.moe_router_fusion": False,
    "checkpoint.save": None,
    "checkpoint.save_interval": None,
}

CASES = [
    pytest.param(recipe, key, value, id=f"{recipe.__name__}:{key}")
    for recipe, _ in UPSTREAM_RECIPES
    for key, value in {**UPSTREAM_VALUES, **RUNS_WITHOUT_OPTIONAL_PACKAGES}.items()
]


@pytest.mark.parametrize("recipe, key, expected", CASES)
def test_recipe_field_has_the_upstream_or_package_free_value(recipe, key, expected):
    assert read_field(recipe(), key) == expected


@pytest.mark.parametrize("recipe, gpus", UPSTREAM_RECIPES)
def test_schedule_spans_the_run_and_data_follows_the_model(recipe, gpus):
    resolved = recipe().validate(world_size=gpus)
    assert resolved.scheduler.lr_decay_iters == resolved.train.train_iters  # upstream: None = train_iters
    assert resolved.dataset.seq_length == resolved.model.seq_length
    assert resolved.tokenizer.vocab_size in (None, resolved.model.vocab_size)


@pytest.fixture
def torch_optimizer():
    """A real torch optimizer whose param group the megatron-core scheduler writes."""
    weight = torch.nn.Parameter(torch.zeros(2))
    return torch.optim.AdamW([weight], lr=0.0, weight_decay=0.1)


@pytest.mark.parametrize("recipe, gpus", UPSTREAM_RECIPES)
def test_weight_decay_schedule_reaches_the_optimizer(recipe, gpus, torch_optimizer):
    resolved = recipe().validate(world_size=gpus)
    scheduler = build_scheduler(resolved, torch_optimizer)
    assert torch_optimizer.param_groups[0]["weight_decay"] == pytest.approx(0.033)
    scheduler.step(increment=resolved.train.global_batch_size * 1000)
    assert torch_optimizer.param_groups[0]["weight_decay"] == pytest.approx(0.033)
