"""Every general rule has a passing and a failing case; all violations are reported together."""

import dataclasses

import pytest
from packaging.version import Version

from megatron.bridge.recipes.qwen import qwen3_30b_a3b_pretrain_config, qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.errors import ConfigValidationError
from megatron.bridge.training.finalize import default_rule_context
from megatron.bridge.training.rules import check_rules
from megatron.bridge.training.validation import GENERAL_RULES

TE_ABSENT = dict(te_version=None)
TE_PRESENT = dict(te_version=Version("2.12.0"))


def _set(**changes):
    """A mutation: dotted path -> value."""

    def mutate(cfg):
        for dotted, value in changes.items():
            *parents, leaf = dotted.split(".")
            target = cfg
            for p in parents:
                target = getattr(target, p)
            setattr(target, leaf, value)
        return cfg

    return mutate


# rule id -> (context facts, mutation that breaks the rule, mutation that satisfies it)
CASES = {
    "mixed-precision-known": ({}, _set(mixed_precision="bf17"), _set(mixed_precision="fp16_mixed")),
    "fp8-needs-transformer-engine": (
        TE_ABSENT, _set(mixed_precision="bf16_with_fp8_delayed_scaling_mixed"), _set(mixed_precision="bf16_mixed")),
    "layer-spec-known": ({}, _set(**{"model.layer_spec": "triton"}), _set(**{"model.layer_spec": "local"})),
    "te-layer-spec-needs-transformer-engine": (
        TE_ABSENT, _set(**{"model.layer_spec": "transformer_engine"}), _set(**{"model.layer_spec": "auto"})),
    "cross-entropy-impl-known": (
        {}, _set(**{"model.cross_entropy_fusion_impl": "apex"}),
        _set(**{"model.cross_entropy_fusion_impl": "native"})),
    "te-cross-entropy-needs-transformer-engine": (
        TE_ABSENT, _set(**{"model.cross_entropy_loss_fusion": True, "model.cross_entropy_fusion_impl": "te"}),
        _set(**{"model.cross_entropy_loss_fusion": True, "model.cross_entropy_fusion_impl": "torch_native"})),
    "train-iters-positive": ({}, _set(**{"train.train_iters": 0}), _set(**{"train.train_iters": 1})),
    "lr-warmup-shorter-than-decay": (
        {}, _set(**{"scheduler.lr_warmup_iters": 500, "scheduler.lr_decay_iters": None, "train.train_iters": 8}),
        _set(**{"scheduler.lr_warmup_iters": 500, "scheduler.lr_decay_iters": 300_000, "train.train_iters": 8})),
    "micro-batch-divides-global-batch": (
        {}, _set(**{"train.global_batch_size": 10, "train.micro_batch_size": 4}),
        _set(**{"train.global_batch_size": 12, "train.micro_batch_size": 4})),
    "layout-divides-world-size": (
        dict(world_size=12), _set(**{"model.expert_model_parallel_size": 1, "model.tensor_model_parallel_size": 8}),
        _set(**{"model.expert_model_parallel_size": 1, "model.tensor_model_parallel_size": 4})),
    "expert-layout-divides-world-size": (
        dict(world_size=24), _set(**{"model.expert_model_parallel_size": 16}),
        _set(**{"model.expert_model_parallel_size": 8})),
    "data-parallel-divides-global-batch": (
        dict(world_size=16), _set(**{"train.global_batch_size": 24}), _set(**{"train.global_batch_size": 32})),
    "experts-divisible-by-ep": (
        {}, _set(**{"model.expert_model_parallel_size": 3}), _set(**{"model.expert_model_parallel_size": 4})),
    "ep-needs-moe": (
        {}, _set(**{"model.num_moe_experts": None}), _set(**{"model.expert_model_parallel_size": 1})),
    "sequence-parallel-needs-tp": (
        {}, _set(**{"model.sequence_parallel": True}),
        _set(**{"model.sequence_parallel": True, "model.tensor_model_parallel_size": 2})),
    "layers-divisible-by-pipeline": (
        {}, _set(**{"model.pipeline_model_parallel_size": 5}),
        _set(**{"model.pipeline_model_parallel_size": 4})),
    "vocab-size-set": ({}, _set(**{"model.vocab_size": None}), _set(**{"model.vocab_size": 32000})),
    "hf-tokenizer-needs-model": (
        {}, _set(**{"tokenizer.tokenizer_type": "HuggingFaceTokenizer"}),
        _set(**{"tokenizer.tokenizer_type": "HuggingFaceTokenizer", "tokenizer.tokenizer_model": "/tok"})),
    "steady-state-window": (
        {}, _set(**{"logger.steady_state_window": [8, 3]}), _set(**{"logger.steady_state_window": [2, 4]})),
    "cpu-mode-needs-gloo": (
        {}, _set(**{"dist.device": "cpu", "dist.distributed_backend": "nccl"}),
        _set(**{"dist.device": "cpu", "dist.distributed_backend": None})),
    "save-interval-needs-save-dir": (
        {}, _set(**{"checkpoint.save_interval": 5}),
        _set(**{"checkpoint.save_interval": 5, "checkpoint.save": "/tmp/ckpt"})),
    "profile-steps-ordered": (
        {}, _set(**{"profiling.use_pytorch_profiler": True, "profiling.profile_step_start": 6,
                    "profiling.profile_step_end": 5}),
        _set(**{"profiling.use_pytorch_profiler": True})),
}


def test_every_general_rule_has_cases():
    assert set(CASES) == {rule.id for rule in GENERAL_RULES}


def _violated_ids(cfg, facts):
    ctx = dataclasses.replace(default_rule_context(), **facts)
    return {v.rule for v in check_rules(GENERAL_RULES, cfg, ctx)}


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_negative_case_is_reported(rule_id):
    facts, breaks, _ = CASES[rule_id]
    cfg = breaks(qwen3_30b_a3b_pretrain_config())
    assert rule_id in _violated_ids(cfg, facts)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_positive_case_passes(rule_id):
    facts, _, satisfies = CASES[rule_id]
    cfg = satisfies(qwen3_30b_a3b_pretrain_config())
    assert rule_id not in _violated_ids(cfg, facts)


def test_validate_reports_all_violations_at_once_with_fields_values_and_fixes():
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.train.train_iters = 0
    cfg.model.vocab_size = None
    cfg.logger.steady_state_window = [5, 1]
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate()
    err = info.value
    assert {v.rule for v in err.violations} >= {"train-iters-positive", "vocab-size-set", "steady-state-window"}
    text = str(err)
    assert "train.train_iters=0" in text and "fix:" in text
    assert isinstance(err, ValueError)


def test_megatron_core_assertions_become_typed_errors():
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.model.tensor_model_parallel_size = 3  # 4 heads do not split over 3 ranks: megatron-core refuses
    with pytest.raises(ConfigValidationError, match="megatron-core rejected"):
        cfg.validate()


def test_world_size_checks_are_skipped_without_a_world_size(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = qwen3_30b_a3b_pretrain_config()
    cfg.validate()  # EP16 needs 16 GPUs, but no world size is known yet
    with pytest.raises(ConfigValidationError, match="expert-layout-divides-world-size"):
        cfg.validate(world_size=8)
