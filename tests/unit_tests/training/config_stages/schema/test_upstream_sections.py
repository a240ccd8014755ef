"""A container built the way Megatron-Bridge's tests and scripts build one: its sections, its
names, and what ``validate()`` makes of the upstream fields that have no effect here."""

from __future__ import annotations

from typing import Any

import pytest
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig

from megatron.bridge.models.gpt_provider import GPTModelProvider
from megatron.bridge.training.comm_overlap import CommOverlapConfig
from megatron.bridge.training.config import (
    CheckpointConfig,
    ConfigContainer,
    DistributedInitConfig,
    GPTDatasetConfig,
    LoggerConfig,
    RerunStateMachineConfig,
    RNGConfig,
    SchedulerConfig,
    TrainingConfig,
    ValidationConfig,
)
from megatron.bridge.training.config_stages.schema.rule_base import read_field
from megatron.bridge.training.config_stages.schema.upstream_sections import NO_EFFECT_FIELDS
from megatron.bridge.training.errors import CommOverlapConfigError, ConfigValidationError
from megatron.bridge.training.tokenizers.config import TokenizerConfig

SEQ = 512


def upstream_style_container(**model: Any) -> ConfigContainer:
    """Every section given explicitly, with the constructors and values upstream tests use."""
    return ConfigContainer(
        train=TrainingConfig(global_batch_size=32, micro_batch_size=1, train_iters=1000),
        model=GPTModelProvider(
            num_layers=1,
            hidden_size=128,
            num_attention_heads=4,
            seq_length=SEQ,
            apply_rope_fusion=False,
            vocab_size=1000,
            **model,
        ),
        optimizer=OptimizerConfig(lr=0.0001, use_distributed_optimizer=False),
        scheduler=SchedulerConfig(lr_decay_style="linear", lr_warmup_iters=0),
        dataset=GPTDatasetConfig(
            random_seed=1234, seq_length=SEQ, reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False
        ),
        logger=LoggerConfig(),
        tokenizer=TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=1000),
        checkpoint=CheckpointConfig(ckpt_format="torch_dist"),
        dist=DistributedInitConfig(use_gloo_process_groups=True, lazy_mpu_init=False),
        ddp=DistributedDataParallelConfig(),
        rng=RNGConfig(),
        rerun_state_machine=RerunStateMachineConfig(),
        profiling=None,
        validation=ValidationConfig(),
    )


MOE = dict(num_moe_experts=2, expert_model_parallel_size=2, moe_token_dispatcher_type="alltoall", add_bias_linear=False)


@pytest.fixture
def cpu_host(simulate_host) -> None:
    """No visible GPU and no deep_ep."""
    simulate_host(gpu_capability=None, gpu_name=None, gpus=0, packages=())


def test_upstream_style_container_validates(cpu_host) -> None:
    resolved = upstream_style_container().validate(world_size=1)
    assert resolved.dataset.seq_length == resolved.model.seq_length == SEQ


@pytest.mark.parametrize(
    "case, overlap, dist, rule, error",
    [
        (
            "ep overlap with delayed wgrad",
            dict(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True),
            {},
            None,
            None,
        ),
        (
            "delayed wgrad without ep overlap",
            dict(overlap_moe_expert_parallel_comm=False, delay_wgrad_compute=True),
            {},
            "delay-wgrad-needs-ep-overlap",
            CommOverlapConfigError,
        ),
        (
            "deepep on gb200",
            dict(overlap_moe_expert_parallel_comm=True),
            dict(target_gpu="gb200"),
            "flex-backend-supported-on-gpu",
            CommOverlapConfigError,
        ),
    ],
)
def test_upstream_style_container_reaches_the_overlap_rules(case, overlap, dist, rule, error, cpu_host) -> None:
    model = dict(MOE, moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="deepep") if dist else MOE
    cfg = upstream_style_container(**model)
    cfg.comm_overlap = CommOverlapConfig(**overlap)
    for name, value in dist.items():
        setattr(cfg.dist, name, value)
    if rule is None:
        assert cfg.validate(world_size=2).comm_overlap.delay_wgrad_compute is True
        return
    with pytest.raises(error) as info:
        cfg.validate(world_size=2)
    assert rule in {v.rule for v in info.value.violations}


NON_DEFAULT: dict[str, Any] = {
    "validation.start_eval_at_iter": 100,
    "validation.eval_global_batch_size": 16,
    "validation.eval_micro_batch_size": 2,
    "validation.skip_train": True,
    "validation.test_mode": True,
    "validation.full_validation": True,
    "validation.multiple_validation_sets": True,
    "validation.validation_set_names": ["wiki"],
    "rerun_state_machine.rerun_mode": "validate_results",
    "rerun_state_machine.check_for_nan_in_loss": True,
    "rerun_state_machine.check_for_spiky_loss": True,
    "rerun_state_machine.spiky_loss_factor": 5.0,
    "rerun_state_machine.error_injection_rate": 1000,
    "rerun_state_machine.error_injection_type": "persistent_error",
    "dist.use_gloo_process_groups": False,
    "dist.lazy_mpu_init": True,
    "dataset.dataloader_type": "cyclic",
    "dataset.num_dataset_builder_threads": 4,
}
"""A value other than the default for each upstream field without effect."""


def test_every_field_without_effect_has_a_case() -> None:
    assert set(NON_DEFAULT) == {f.field for f in NO_EFFECT_FIELDS}


@pytest.mark.parametrize("dotted, value", list(NON_DEFAULT.items()), ids=list(NON_DEFAULT))
def test_field_without_effect_is_refused_away_from_its_default(dotted: str, value: Any, cpu_host) -> None:
    cfg = upstream_style_container()
    section, _, name = dotted.rpartition(".")
    setattr(read_field(cfg, section), name, value)
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate(world_size=1)
    (violation,) = [v for v in info.value.violations if v.rule == f"no-effect:{dotted}"]
    assert violation.fields == (dotted,) and violation.values == (value,)
    assert "no effect" in violation.message and violation.fix
    assert f"{dotted}={value!r}" in str(info.value)


def test_tokenizer_config_is_one_class_under_both_paths() -> None:
    from megatron.bridge.training import config as training_config

    assert training_config.TokenizerConfig is TokenizerConfig
    assert isinstance(upstream_style_container().tokenizer, training_config.TokenizerConfig)


@pytest.mark.parametrize(
    "build, expected",
    [
        (lambda: ValidationConfig(eval_iters=7, eval_interval=50), (7, 50)),
        (lambda: ValidationConfig(eval_interval=25), (0, 25)),
        (lambda: ValidationConfig(), (0, None)),
    ],
    ids=["both", "interval", "neither"],
)
def test_validation_eval_settings_are_written_into_train(build, expected) -> None:
    cfg = upstream_style_container()
    cfg.validation = build()
    assert (cfg.train.eval_iters, cfg.train.eval_interval) == expected
    assert (cfg.validation.eval_iters, cfg.validation.eval_interval) == expected


def test_validation_alias_writes_train_and_reads_it_back() -> None:
    cfg = upstream_style_container()
    cfg.validation.eval_interval = 10
    cfg.train.eval_iters = 4
    assert cfg.train.eval_interval == 10 and cfg.validation.eval_iters == 4
    cfg.train = TrainingConfig(eval_iters=9)
    assert cfg.validation.eval_iters == 9


def test_validation_alias_conflicting_with_train_is_refused() -> None:
    cfg = upstream_style_container()
    cfg.train.eval_iters = 5
    with pytest.raises(ConfigValidationError) as info:
        cfg.validation = ValidationConfig(eval_iters=8)
    assert {"validation.eval_iters", "train.eval_iters"} <= info.value.fields


def test_one_section_in_two_containers_reads_each_train() -> None:
    shared = ValidationConfig()
    first, second = upstream_style_container(), upstream_style_container()
    first.validation, second.validation = shared, shared
    first.train.eval_iters, second.train.eval_iters = 1, 2
    assert (first.validation.eval_iters, second.validation.eval_iters) == (1, 2)


def test_yaml_round_trip_keeps_the_upstream_sections(tmp_path, cpu_host) -> None:
    cfg = upstream_style_container()
    cfg.validation = ValidationConfig(eval_iters=3, eval_interval=20)
    path = tmp_path / "cfg.yaml"
    text = cfg.to_yaml(path)
    assert "validation:" in text and "rerun_state_machine:" in text
    loaded = ConfigContainer.from_yaml(path)
    assert (loaded.validation.eval_iters, loaded.validation.eval_interval) == (3, 20)
    loaded.validation.eval_iters = 6
    assert loaded.train.eval_iters == 6 and cfg.train.eval_iters == 3
    loaded.validation.eval_iters = 3
    cfg.validate(world_size=1), loaded.validate(world_size=1)
    assert loaded == cfg
    assert loaded.rerun_state_machine == RerunStateMachineConfig()
