"""Megatron-Bridge scripts run here unchanged, or fail loudly: names, forms and helpers users bring.

Written from Megatron-Bridge's documented behaviour (its pretraining example, recipe-usage guide and
configuration reference), not from its code.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from megatron.core.optimizer import OptimizerConfig
from omegaconf import OmegaConf

from megatron.bridge.recipes.qwen import qwen3_30b_a3b_pretrain_config, qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.comm_overlap import CommOverlapConfig
from megatron.bridge.training.config import ConfigContainer, TrainingConfig
from megatron.bridge.training.errors import ConfigValidationError, OverrideError, UnknownFieldError
from megatron.bridge.training.loop.data import build_tokenizer, build_train_dataset, gpt_dataset_config
from megatron.bridge.training.mixed_precision import MixedPrecisionConfig, get_mixed_precision_config
from megatron.bridge.training.utils.omegaconf_utils import (
    OverridesError,
    apply_overrides,
    create_omegaconf_dict_config,
    parse_hydra_overrides,
)


@pytest.fixture
def corpus(indexed_corpus) -> str:
    """The user's data: a small indexed dataset as megatron-core's preprocessing writes it."""
    return indexed_corpus


def documented_qwen3_30b_a3b_script(data_path: str, tmp_path) -> ConfigContainer:
    """Megatron-Bridge's Qwen3-30B-A3B pretraining example, as a user would type it."""
    config = qwen3_30b_a3b_pretrain_config()
    config.dataset.data_path = data_path
    config.checkpoint.save = str(tmp_path / "checkpoints")
    config.logger.tensorboard_dir = str(tmp_path / "tb")
    config.train.train_iters = 1000
    config.train.global_batch_size = 64
    config.train.micro_batch_size = 1
    config.scheduler.lr_decay_iters = 1000
    config.model.seq_length = 4096
    config.dataset.seq_length = 4096
    return config


def test_documented_qwen3_example_trains_on_the_users_data(corpus, tmp_path):
    """The user's data path reaches megatron's GPTDataset (not mock data); every setting stands."""
    final = documented_qwen3_30b_a3b_script(corpus, tmp_path).validate(world_size=16)
    assert final.dataset.data_paths == [corpus] and not final.dataset.is_mock
    assert gpt_dataset_config(final, build_tokenizer(final)).blend == ([corpus], None)
    assert final.logger.tensorboard_dir == str(tmp_path / "tb")
    assert (final.train.train_iters, final.scheduler.lr_decay_iters, final.model.seq_length) == (1000, 1000, 4096)


def test_the_users_data_path_builds_an_indexed_dataset(corpus, tmp_path):
    from megatron.core.datasets.gpt_dataset import GPTDataset, MockGPTDataset

    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.dist.device, cfg.train.train_iters = "cpu", 2
    cfg.dataset.data_path, cfg.dataset.split = corpus, "100,0,0"
    cfg.dataset.path_to_cache = str(tmp_path / "cache")
    dataset = build_train_dataset(cfg)
    assert isinstance(dataset, GPTDataset) and not isinstance(dataset, MockGPTDataset)


def test_a_missing_data_path_is_refused_before_launch(tmp_path):
    missing = str(tmp_path / "nowhere" / "corpus_text_document")
    with pytest.raises(ConfigValidationError) as info:
        documented_qwen3_30b_a3b_script(missing, tmp_path).validate(world_size=16)
    text = str(info.value)
    assert "dataset-files-exist" in text and "dataset.data_paths" in text and missing + ".bin" in text


def test_dataset_seq_length_must_agree_with_the_model(corpus, tmp_path):
    cfg = documented_qwen3_30b_a3b_script(corpus, tmp_path)
    cfg.dataset.seq_length = 2048
    with pytest.raises(ConfigValidationError, match=r"owned-field-set-directly[\s\S]*model.seq_length=2048"):
        cfg.validate(world_size=16)


def test_dataset_random_seed_shuffles_the_data(tmp_path):
    def first_tokens(**dataset):
        cfg = qwen3_moe_tiny_pretrain_config()
        cfg.dist.device, cfg.train.train_iters = "cpu", 2
        cfg.dataset.path_to_cache = str(tmp_path / f"cache{len(dataset)}{dataset.get('random_seed')}")
        for key, value in dataset.items():
            setattr(cfg.dataset, key, value)
        return build_train_dataset(cfg)[3]["tokens"]

    assert torch.equal(first_tokens(random_seed=1234), first_tokens())  # null: rng.seed (1234)
    assert not torch.equal(first_tokens(random_seed=7), first_tokens())


# ------------------------------------------------------------------------------------------------
# Unknown attributes are refused, with the closest field
# ------------------------------------------------------------------------------------------------

TYPOS = [
    ("", "mixed_precison", "mixed_precision"),
    ("model", "num_layer", "num_layers"),
    ("train", "train_iter", "train_iters"),
    ("optimizer", "lrr", "lr"),
    ("ddp", "use_distributed_optimiser", "use_distributed_optimizer"),
    ("scheduler", "lr_decay_iter", "lr_decay_iters"),
    ("dataset", "data_pth", "data_path"),
    ("tokenizer", "tokenizer_modle", "tokenizer_model"),
    ("logger", "tensorboard_dri", "tensorboard_dir"),
    ("checkpoint", "save_intervall", "save_interval"),
    ("dist", "distributed_backnd", "distributed_backend"),
    ("rng", "seeed", "seed"),
    ("profiling", "profile_step_strat", "profile_step_start"),
    ("comm_overlap", "overlap_moe_expert_parallel_com", "overlap_moe_expert_parallel_comm"),
]


def _holder(cfg, path):
    return cfg if not path else getattr(cfg, path)


@pytest.mark.parametrize("path, typo, meant", TYPOS, ids=[f"{p or 'container'}.{t}" for p, t, _ in TYPOS])
def test_unknown_attribute_is_refused_with_the_closest_field(path, typo, meant):
    holder = _holder(qwen3_30b_a3b_pretrain_config(), path)
    with pytest.raises(UnknownFieldError) as info:
        setattr(holder, typo, 1)
    text = str(info.value)
    assert typo in text and meant in text and "did you mean" in text
    assert isinstance(info.value, AttributeError) and not hasattr(holder, typo)


def test_a_replaced_megatron_core_sub_config_refuses_too():
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.optimizer = OptimizerConfig(lr=1e-4)
    assert isinstance(cfg.optimizer, OptimizerConfig)
    with pytest.raises(UnknownFieldError) as info:
        cfg.optimizer.weight_decy = 0.1
    assert "OptimizerConfig.weight_decy" in str(info.value) and "did you mean weight_decay" in str(info.value)


def test_mixed_precision_object_refuses_unknown_fields():
    with pytest.raises(UnknownFieldError, match="did you mean grad_reduce_in_fp32"):
        get_mixed_precision_config("bf16_mixed").grad_reduce_in_fp3 = False


def test_megatron_core_may_attach_its_run_time_attributes(tmp_path):
    """megatron-core's own code attaches hooks to its configs while it trains (seen here as code
    whose module is megatron-core's); a user's script may not."""
    cfg = qwen3_moe_tiny_pretrain_config()
    megatron_code = compile("config.no_sync_hook_for_test = 1", "megatron_core_stand_in", "exec")
    exec(megatron_code, {"__name__": "megatron.core.distributed.stand_in", "config": cfg.model})
    assert cfg.model.no_sync_hook_for_test == 1
    with pytest.raises(UnknownFieldError):
        exec(megatron_code, {"__name__": "user_script", "config": cfg.model})


def test_known_fields_properties_and_private_names_stay_settable():
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.model.no_sync_func = None  # a megatron-core field set by the training loop
    cfg.model._private_cache = 1
    cfg.dataset.data_path = "/data/a"
    assert cfg.dataset.data_paths == ["/data/a"]


# ------------------------------------------------------------------------------------------------
# Names and forms
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dotted, value, check",
    [
        ("dataset.data_path", "/data/a", lambda c: c.dataset.data_paths == ["/data/a"]),
        (
            "dataset.data_path",
            ["0.3", "/data/a", "0.7", "/data/b"],
            lambda c: c.dataset.data_paths == ["0.3", "/data/a", "0.7", "/data/b"],
        ),
        ("dataset.seq_length", 4096, lambda c: c.dataset.seq_length == 4096),
        ("dataset.random_seed", 7, lambda c: c.dataset.random_seed == 7),
        ("logger.tensorboard_dir", "/tb", lambda c: c.logger.tensorboard_dir == "/tb"),
        (
            "tokenizer.hf_tokenizer_kwargs",
            {"use_fast": True},
            lambda c: c.tokenizer.hf_tokenizer_kwargs == {"use_fast": True},
        ),
        ("rng.te_rng_tracker", True, lambda c: c.rng.te_rng_tracker is True),
        ("comm_overlap.data_parallel_size", 16, lambda c: c.comm_overlap.data_parallel_size == 16),
    ],
)
@pytest.mark.parametrize("route", ["python", "override", "yaml"])
def test_upstream_names_work_in_python_overrides_and_yaml(dotted, value, check, route, tmp_path):
    cfg = qwen3_30b_a3b_pretrain_config()
    section, name = dotted.split(".")
    if route == "python":
        setattr(getattr(cfg, section), name, value)
    elif route == "override":
        cfg = apply_overrides(cfg, {section: {name: value}})
    else:
        path = tmp_path / "over.yaml"
        path.write_text(OmegaConf.to_yaml(OmegaConf.create({section: {name: value}})))
        from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

        cfg = process_config_with_overrides(cfg, config_filepath=path)
    assert check(cfg)


def test_tensorboard_dir_is_where_the_events_go(tmp_path, monkeypatch):
    from megatron.bridge.training.telemetry import metrics

    opened = []
    monkeypatch.setattr(metrics, "open_tensorboard", lambda directory: opened.append(directory))
    metrics.MetricsLogger(
        train_iters=1,
        tokens_per_step=1,
        flops_per_step=1.0,
        world_size=1,
        device="cpu",
        log_dir=str(tmp_path / "logs"),
        tensorboard=True,
        tensorboard_dir=str(tmp_path / "tb"),
    )
    assert opened == [str(tmp_path / "tb")]


@pytest.mark.parametrize(
    "setting, expected",
    [
        ("bf16_mixed", dict(bf16=True, params_dtype=torch.bfloat16, grad_reduce_in_fp32=True)),
        (
            MixedPrecisionConfig(bf16=True, params_dtype=torch.bfloat16, grad_reduce_in_fp32=False),
            dict(bf16=True, params_dtype=torch.bfloat16, grad_reduce_in_fp32=False),
        ),
        (MixedPrecisionConfig(fp16=True), dict(fp16=True, params_dtype=torch.half, grad_reduce_in_fp32=True)),
    ],
    ids=["name", "object", "object-derived-dtype"],
)
def test_mixed_precision_as_a_name_or_an_object(setting, expected):
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.mixed_precision = setting
    final = cfg.validate(world_size=2)
    assert final.model.bf16 is expected.get("bf16", False) and final.model.fp16 is expected.get("fp16", False)
    assert (
        final.model.params_dtype is expected["params_dtype"]
        and final.optimizer.params_dtype is expected["params_dtype"]
    )
    assert final.ddp.grad_reduce_in_fp32 is expected["grad_reduce_in_fp32"]


def test_mixed_precision_object_edited_by_override_and_saved(tmp_path):
    cfg = apply_overrides(qwen3_moe_tiny_pretrain_config(), ["mixed_precision.grad_reduce_in_fp32=false"])
    assert cfg.mixed_precision == dataclasses.replace(
        get_mixed_precision_config("bf16_mixed"), grad_reduce_in_fp32=False
    )
    path = tmp_path / "cfg.yaml"
    cfg.to_yaml(path)
    assert ConfigContainer.from_yaml(path).mixed_precision == cfg.mixed_precision
    assert cfg.validate(world_size=2).ddp.grad_reduce_in_fp32 is False


def test_comm_overlap_data_parallel_size_decides_the_defaults_without_a_world_size(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = qwen3_30b_a3b_pretrain_config()
    assert cfg.resolve().values["overlap_grad_reduce"].value is False  # DP unknown: left off
    cfg.comm_overlap = CommOverlapConfig(data_parallel_size=8)
    assert cfg.resolve().values["overlap_grad_reduce"].value is True
    with pytest.raises(ConfigValidationError, match="data-parallel-size-matches-layout"):
        cfg.validate(world_size=16)  # EP=16 on 16 GPUs: DP 16, not 8


@pytest.mark.parametrize(
    "change, rule",
    [
        ({"tp_comm_overlap": True}, "tp-overlap-userbuffers-not-initialised"),
        ({"tp_comm_overlap_cfg": {"qkv_fprop": {"method": "ring_exchange"}}}, "tp-overlap-cfg-needs-tp-overlap"),
    ],
)
def test_tp_overlap_settings_without_effect_are_refused(change, rule):
    cfg = qwen3_30b_a3b_pretrain_config()
    cfg.model.tensor_model_parallel_size, cfg.model.sequence_parallel = 2, True
    for name, value in change.items():
        setattr(cfg.comm_overlap, name, value)
    with pytest.raises(ConfigValidationError, match=rule):
        cfg.validate(world_size=16)


# ------------------------------------------------------------------------------------------------
# Override helpers
# ------------------------------------------------------------------------------------------------


def test_documented_yaml_workflow_updates_the_config_in_place(tmp_path):
    cfg = qwen3_moe_tiny_pretrain_config()
    yaml_file = tmp_path / "over.yaml"
    yaml_file.write_text("train:\n  train_iters: 20\ndataset:\n  data_path: /data/a\n")
    merged, excluded = create_omegaconf_dict_config(cfg)
    merged = OmegaConf.merge(merged, OmegaConf.load(yaml_file))
    apply_overrides(cfg, OmegaConf.to_container(merged, resolve=True), excluded)
    assert cfg.train.train_iters == 20 and cfg.dataset.data_paths == ["/data/a"]
    assert cfg.provenance == {"train.train_iters": "cli", "dataset.data_paths": "cli"}


def test_documented_hydra_workflow_and_excluded_fields():
    cfg = qwen3_moe_tiny_pretrain_config()
    activation = lambda x: x  # noqa: E731 - no text form: kept aside and restored
    cfg.model.activation_func = activation
    merged, excluded = create_omegaconf_dict_config(cfg)
    assert excluded == {"model.activation_func": activation}
    merged = parse_hydra_overrides(
        merged, ["model.num_layers=3", "+tokenizer.hf_tokenizer_kwargs.use_fast=true", "++train.train_iters=5"]
    )
    apply_overrides(cfg, OmegaConf.to_container(merged, resolve=True), excluded)
    assert (cfg.model.num_layers, cfg.train.train_iters) == (3, 5)
    assert cfg.tokenizer.hf_tokenizer_kwargs == {"use_fast": True}
    assert cfg.model.activation_func is activation


def test_hydra_override_problems_are_reported_together():
    merged, _ = create_omegaconf_dict_config(qwen3_moe_tiny_pretrain_config())
    with pytest.raises(OverridesError) as info:
        parse_hydra_overrides(merged, ["train.train_iter=1", "+train.train_iters=3", "~nope", "justakey"])
    assert len(info.value.violations) == 4 and "did you mean train.train_iters" in str(info.value)
    assert OverridesError is OverrideError


def test_in_place_form_refuses_bad_values_and_leaves_the_config_unchanged():
    cfg = qwen3_moe_tiny_pretrain_config()
    merged, excluded = create_omegaconf_dict_config(cfg)
    data = OmegaConf.to_container(merged)
    data["train"]["train_iters"], data["model"]["num_layer"] = "many", 3
    with pytest.raises(OverrideError) as info:
        apply_overrides(cfg, data, excluded)
    assert {"train.train_iters", "model.num_layer"} <= info.value.fields
    assert cfg.train.train_iters == qwen3_moe_tiny_pretrain_config().train.train_iters


@pytest.mark.parametrize(
    "overrides, check",
    [
        (
            ["+tokenizer.hf_tokenizer_kwargs.use_fast=true"],
            lambda c: c.tokenizer.hf_tokenizer_kwargs == {"use_fast": True},
        ),
        (["++train.train_iters=9"], lambda c: c.train.train_iters == 9),
        (
            ["++tokenizer.hf_tokenizer_kwargs={a: 1, b: 2}", "~tokenizer.hf_tokenizer_kwargs.a"],
            lambda c: c.tokenizer.hf_tokenizer_kwargs == {"b": 2},
        ),
    ],
)
def test_hydra_forms_in_dotted_overrides(overrides, check):
    assert check(apply_overrides(qwen3_moe_tiny_pretrain_config(), overrides))


def test_removing_a_field_is_refused():
    with pytest.raises(OverrideError, match="cannot be removed"):
        apply_overrides(qwen3_moe_tiny_pretrain_config(), ["~train.train_iters"])


def test_helpers_work_on_any_config_dataclass():
    train = TrainingConfig()
    tree, excluded = create_omegaconf_dict_config(train)
    tree = parse_hydra_overrides(tree, ["train_iters=42"])
    apply_overrides(train, OmegaConf.to_container(tree), excluded)
    assert train.train_iters == 42
    assert apply_overrides(TrainingConfig(), ["global_batch_size=16"]).global_batch_size == 16
    with pytest.raises(OverrideError, match="did you mean train_iters"):
        apply_overrides(TrainingConfig(), ["train_iter=1"])


# ------------------------------------------------------------------------------------------------
# Forward step signatures (the training run with each: tests/functional_tests/test_cpu_training.py)
# ------------------------------------------------------------------------------------------------


def ours(data_iterator, model, return_schedule_plan=False):
    return ("ours", data_iterator, model, return_schedule_plan)


def state_first(state, data_iterator, model, return_schedule_plan=False):
    return ("state", state, data_iterator, model, return_schedule_plan)


class GlobalState:  # the annotation Megatron-Bridge scripts use
    pass


def annotated(st: GlobalState, data_iterator, model, return_schedule_plan=False):
    return ("annotated", st, data_iterator, model, return_schedule_plan)


def two_arguments(data_iterator, model):
    return ("two", data_iterator, model)


@pytest.mark.parametrize(
    "func, expected",
    [
        (ours, ("ours", "it", "m", True)),
        (state_first, ("state", "S", "it", "m", True)),
        (annotated, ("annotated", "S", "it", "m", True)),
    ],
    ids=["ours", "state-first", "annotated-state"],
)
def test_forward_step_signature_is_detected_from_the_callable(func, expected):
    from megatron.bridge.training.loop.forward_step import bind_forward_step

    bound = bind_forward_step(func, "S")
    assert bound("it", "m", return_schedule_plan=True) == expected


def test_forward_step_without_schedule_plan_is_refused_under_ep_overlap():
    from megatron.bridge.training.errors import ConfigError
    from megatron.bridge.training.loop.forward_step import check_forward_step

    check_forward_step(two_arguments, ep_overlap=False)
    with pytest.raises(ConfigError, match="return_schedule_plan"):
        check_forward_step(two_arguments, ep_overlap=True)
