"""The memory rules: a size that cannot fit the target's memory is refused by ``validate()`` with the
estimate and the limit; the recipes at their layouts pass (the estimate is a lower bound)."""

import importlib
import inspect
import re

import pytest

from megatron.bridge.perf.harness.recipe_lookup import minimum_world_size
from megatron.bridge.recipes.qwen import qwen3_30b_a3b_pretrain_config, qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.config_stages.facts.memory_estimate import estimate_per_rank
from megatron.bridge.training.config_stages.resolution.finalize import default_rule_context, resolve_config
from megatron.bridge.training.config_stages.rules.memory_rules import MEMORY_RULES
from megatron.bridge.training.errors import ConfigValidationError

MEMORY_RULE_IDS = {rule.id for rule in MEMORY_RULES}


def _on_h100(cfg):
    cfg.dist.target_gpu = "h100"
    return cfg


def _on_cpu(cfg):
    cfg.dist.device = "cpu"
    cfg.model.expert_model_parallel_size = 2
    return cfg


def _emulated_on_cpu(cfg):
    cfg.dist.device = "cpu"
    cfg.emulation.world_size = 16
    cfg.model.expert_model_parallel_size = 8
    cfg.train.global_batch_size = 16  # data-parallel 16
    return cfg


def _sized(cfg, **model):
    for name, value in model.items():
        setattr(cfg.model, name, value)
    return cfg


# rule id -> (world size, config that breaks the rule, config that satisfies it, texts of the refusal)
CASES = {
    "model-state-fits-gpu-memory": (
        16,
        lambda: _sized(_on_h100(qwen3_30b_a3b_pretrain_config()), num_moe_experts=100_000),
        lambda: _on_h100(qwen3_30b_a3b_pretrain_config()),  # the README layout: EP16 on 16 H100s
        ["GiB per rank", "limit='94.0 GiB on one h100'", "model.num_moe_experts=100000"],
    ),
    "model-and-activations-fit-gpu-memory": (
        16,
        lambda: _sized(_on_h100(qwen3_30b_a3b_pretrain_config()), seq_length=2**20),
        lambda: _on_h100(qwen3_30b_a3b_pretrain_config()),
        ["state='at least", "activations='at least", "48 layers x 1,048,576 tokens", "model.seq_length=1048576"],
    ),
    "model-state-fits-host-memory": (
        2,
        lambda: _sized(_on_cpu(qwen3_moe_tiny_pretrain_config()), num_moe_experts=100_000_000),
        lambda: _on_cpu(qwen3_moe_tiny_pretrain_config()),
        ["GiB for the 2 rank(s) on this host", "on this host'", "model.num_moe_experts=100000000"],
    ),
    "emulated-rank-fits-host-memory": (
        16,
        lambda: _sized(_emulated_on_cpu(qwen3_moe_tiny_pretrain_config()), num_moe_experts=800_000_000),
        lambda: _emulated_on_cpu(qwen3_moe_tiny_pretrain_config()),
        ["GiB for the 1 rank(s) on this host", "on this host'", "model.num_moe_experts=800000000"],
    ),
}


WARNINGS = {"expected-peak-fits-smallest-gpu"}


def test_every_memory_rule_has_cases():
    assert set(CASES) | WARNINGS == MEMORY_RULE_IDS
    assert {rule.id for rule in MEMORY_RULES if rule.severity == "warning"} == WARNINGS


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_a_size_that_cannot_fit_is_refused_by_validate_and_the_recipe_passes(rule_id):
    world, breaks, satisfies, texts = CASES[rule_id]
    with pytest.raises(ConfigValidationError) as info:
        breaks().validate(world_size=world)
    (violation,) = [v for v in info.value.violations if v.rule == rule_id]
    text = violation.format()
    assert "='at least" in text and "weights" in text and "optimizer state" in text, text
    for fragment in texts:
        assert fragment in text, (fragment, text)
    satisfies().validate(world_size=world)


def test_the_estimate_counts_the_30b_models_parameters():
    """Unsharded, the count is the model's published size (30.5 billion parameters; norms left out)."""
    cfg = qwen3_30b_a3b_pretrain_config()
    cfg.model.expert_model_parallel_size = 1
    params = estimate_per_rank(resolve_config(cfg, world_size=1).effective, 1).params
    assert 30.4e9 < params < 30.6e9, params


def _recipes():
    """Every recipe function with the GPU count and type it is written for (``h100`` when unnamed)."""
    for module_name in ("megatron.bridge.recipes.qwen.qwen3_moe", "megatron.bridge.recipes.qwen.qwen3_moe_perf"):
        module = importlib.import_module(module_name)
        for name, factory in inspect.getmembers(module, inspect.isfunction):
            if (
                name.endswith("_config")
                and factory.__module__ == module_name
                and not inspect.signature(factory).parameters
            ):
                count = re.search(r"_(\d+)gpu", name)
                yield pytest.param(factory, int(count.group(1)) if count else None, id=name)


@pytest.mark.parametrize("factory, gpus", list(_recipes()))
def test_every_recipe_fits_its_target_gpu(factory, gpus):
    cfg = factory()
    ctx = default_rule_context(gpus or minimum_world_size(cfg), target_gpu=cfg.dist.target_gpu or "h100")
    resolution = resolve_config(cfg, ctx=ctx)
    assert not {v.rule for v in resolution.errors} & MEMORY_RULE_IDS


@pytest.mark.parametrize("emulated, refused", [(False, True), (True, False)])
def test_an_emulated_world_on_the_cpu_holds_one_ranks_state_not_every_ranks(emulated, refused, simulate_host):
    """One process plays one rank of the 16: the host holds that rank's share (a 1-layer
    Qwen3-30B-A3B at EP=16 fits a 24 GiB host for one rank, not for sixteen processes)."""
    simulate_host(memory=24 * 2**30)
    cfg = _sized(qwen3_30b_a3b_pretrain_config(), num_layers=1)
    cfg.dist.device = "cpu"
    if emulated:
        cfg.emulation.world_size = 16
    resolution = resolve_config(cfg, ctx=default_rule_context(16, target_gpu="h100"))
    assert (
        bool({v.rule for v in resolution.errors} & {"model-state-fits-host-memory", "emulated-rank-fits-host-memory"})
        is refused
    )


def test_an_emulated_world_too_large_for_the_host_is_told_what_helps_one_process():
    """An emulated world is one process whatever -ng says: "fewer processes" cannot help it."""
    world, breaks, _, _ = CASES["emulated-rank-fits-host-memory"]
    with pytest.raises(ConfigValidationError) as info:
        breaks().validate(world_size=world)
    (violation,) = [v for v in info.value.violations if v.rule.endswith("fits-host-memory")]
    assert violation.rule == "emulated-rank-fits-host-memory"
    assert "fewer processes" not in violation.fix and "fewer processes" not in violation.message
    assert "one process" in violation.fix and "model.num_layers" in violation.fix, violation.fix


def _ep1_reference(cfg):
    """One GPU doing an EP=16 rank's expert work at EP=1: 8 experts, each token to all 8."""
    cfg.model.expert_model_parallel_size = 1
    cfg.model.num_moe_experts = 8
    cfg.train.global_batch_size = 16
    return cfg


@pytest.mark.parametrize(
    "layout, world, gpu, warned",
    [
        pytest.param(_ep1_reference, 1, "h100", True, id="ep1-48-layers-h100-ran-out-of-memory"),
        pytest.param(lambda cfg: cfg, 16, "h100", False, id="ep16-48-layers-h100-trained"),
        pytest.param(_ep1_reference, 1, "h200", False, id="ep1-48-layers-h200"),
    ],
)
def test_a_layout_expected_to_outgrow_the_smallest_gpu_is_warned_of(layout, world, gpu, warned):
    """The 48-layer Qwen3-30B-A3B: the EP=1 reference of an EP=16 rank's work ran out of an 80 GB
    H100's memory mid-training, the EP=16 rank trained on one; neither is refused (each fits a 94 GB
    H100 NVL by the lower bound)."""
    cfg = layout(qwen3_30b_a3b_pretrain_config())
    resolution = resolve_config(cfg, ctx=default_rule_context(world, target_gpu=gpu))
    assert not {v.rule for v in resolution.errors} & MEMORY_RULE_IDS
    warnings = [v for v in resolution.warnings if v.rule in WARNINGS]
    assert bool(warnings) is warned
    if warned:
        text = warnings[0].format()
        assert "expected peak='about 84.4 GiB'" in text and "80.0 GiB on the smallest h100" in text, text
