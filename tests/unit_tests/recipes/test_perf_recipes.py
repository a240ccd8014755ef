"""``megatron.bridge.perf_recipes``: the Qwen3-30B-A3B EP-overlap benchmark configurations under
Megatron-Bridge's names, equal on every overlap value to the harness's EP-overlap command."""

import io

import pytest
from seed_command import for_gpu

import megatron.bridge.perf_recipes as perf_recipes
import megatron.bridge.recipes.qwen as qwen_family
import megatron.bridge.recipes.qwen.qwen3_moe_perf as qwen3_moe_perf
from megatron.bridge.perf.harness.config_builder import OVERLAP_RELATED_KEYS
from megatron.bridge.perf.harness.recipe_lookup import recipe_functions
from megatron.bridge.perf.harness.run import main
from megatron.bridge.training.config_stages.schema.rule_base import read_field
from megatron.bridge.training.utils.omegaconf_utils import config_from_yaml

# (function name, GPU type of the -g flag)
PERF_RECIPES = [
    ("qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config", "h100"),
    ("qwen3_30b_a3b_pretrain_16gpu_h200_bf16_config", "h200"),
]


SEED_VALUES = {
    "comm_overlap.overlap_moe_expert_parallel_comm": True,
    "comm_overlap.delay_wgrad_compute": False,
    "model.moe_shared_expert_overlap": False,
    "model.moe_token_dispatcher_type": "alltoall",
    "model.moe_flex_dispatcher_backend": None,
    "model.cuda_graph_impl": "none",
    "model.tensor_model_parallel_size": 1,
    "model.pipeline_model_parallel_size": 1,
    "model.context_parallel_size": 1,
    "model.expert_model_parallel_size": 16,
    "model.num_moe_experts": 128,
    "train.global_batch_size": 1024,
    "train.micro_batch_size": 1,
    "mixed_precision": "bf16_mixed",
    "tokenizer.tokenizer_type": "NullTokenizer",
}

COPIES = (
    "model.overlap_moe_expert_parallel_comm",
    "model.delay_wgrad_compute",
    "ddp.overlap_grad_reduce",
    "ddp.overlap_param_gather",
    "ddp.align_param_gather",
    "ddp.bucket_size",
    "ddp.delay_wgrad_compute",
)
"""The megatron-facing copies of the overlap switches, derived when the config is resolved."""

NAMES = [name for name, _ in PERF_RECIPES]


def perf_recipe(name):
    return getattr(perf_recipes, name)


@pytest.fixture(scope="module")
def seed_effective(tmp_path_factory):
    """GPU type -> the effective config the harness saves for the EP-overlap command (dry run)."""
    saved = {}
    for _, gpu in PERF_RECIPES:
        folder = tmp_path_factory.mktemp(gpu)
        path = folder / "effective.yaml"
        argv = for_gpu(gpu)
        out = io.StringIO()
        code = main([*argv, "-l", str(folder / "run"), "--dryrun", "--save_config_filepath", str(path)], out=out)
        assert code == 0, out.getvalue()
        saved[gpu] = config_from_yaml(path)
    return saved


@pytest.mark.parametrize("name", NAMES)
def test_both_import_paths_give_the_same_function(name):
    assert name in perf_recipes.__all__ and name in qwen3_moe_perf.__all__
    assert perf_recipe(name) is getattr(qwen3_moe_perf, name)


@pytest.mark.parametrize("name, gpu", PERF_RECIPES)
def test_megatron_bridge_s_package_paths_give_the_same_function(name, gpu):
    """``perf_recipes`` is a package laid out as Megatron-Bridge's: family, GPU type, module."""
    import importlib

    for path in (
        "megatron.bridge.perf_recipes.qwen",
        f"megatron.bridge.perf_recipes.qwen.{gpu}",
        f"megatron.bridge.perf_recipes.qwen.{gpu}.qwen3_moe",
    ):
        assert getattr(importlib.import_module(path), name) is getattr(qwen3_moe_perf, name), path


@pytest.mark.parametrize("name", NAMES)
def test_each_call_returns_a_new_container(name):
    first, second = perf_recipe(name)(), perf_recipe(name)()
    assert first is not second and first.model is not second.model
    first.comm_overlap.overlap_moe_expert_parallel_comm = False
    first.model.expert_model_parallel_size = 8
    assert second.comm_overlap.overlap_moe_expert_parallel_comm is True
    assert second.model.expert_model_parallel_size == 16


@pytest.mark.parametrize("name, gpu", PERF_RECIPES)
def test_validates_on_16_gpus_of_its_type_with_ep_overlap_on(name, gpu):
    cfg = perf_recipe(name)()
    assert cfg.dist.target_gpu == gpu
    resolution = cfg.resolve(world_size=16)
    assert resolution.report.target_gpu.startswith(gpu)
    assert "moe_ep_overlap" in resolution.report.format()
    resolved = cfg.validate(world_size=16)
    assert resolved.model.overlap_moe_expert_parallel_comm is True
    assert resolved.model.delay_wgrad_compute is False
    assert resolved.model.bf16 is True


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("key, expected", SEED_VALUES.items())
def test_has_the_seed_commands_value(name, key, expected):
    assert read_field(perf_recipe(name)(), key) == expected


@pytest.mark.parametrize("name, gpu", PERF_RECIPES)
def test_effective_overlap_values_equal_the_harness_commands(name, gpu, seed_effective, tmp_path):
    cfg = perf_recipe(name)()
    resolution = cfg.resolve(world_size=16)
    path = tmp_path / "perf.yaml"
    resolution.effective.to_yaml(path)
    mine, harness = config_from_yaml(path), seed_effective[gpu]
    keys = [v.key for v in resolution.values.values()] + list(OVERLAP_RELATED_KEYS) + list(COPIES)
    assert len(keys) > 25
    pairs = {key: (read_field(mine, key), read_field(harness, key)) for key in keys}
    assert {key: pair for key, pair in pairs.items() if pair[0] != pair[1]} == {}


@pytest.mark.parametrize("name", NAMES)
def test_benchmark_run_is_short_with_a_schedule_written_for_it(name):
    resolved = perf_recipe(name)().validate(world_size=16)
    schedule = (resolved.train.train_iters, resolved.scheduler.lr_warmup_iters, resolved.scheduler.lr_decay_iters)
    assert schedule == (50, 10, 50)
    assert resolved.checkpoint.save is None and resolved.checkpoint.load is None
    assert resolved.logger.log_interval == 1


@pytest.mark.parametrize("name", NAMES)
def test_not_offered_as_a_harness_recipe(name):
    assert name not in recipe_functions(qwen_family)
