"""A misspelt dotted override is refused from the stored field names, before megatron-core is
imported: with the full check's words (did-you-mean), only where the full check refuses too, and
never where the stored names may be wrong (another megatron-core version) or a key's fields are
not the schema's (an open dict, a ``_target_``, a field that is not a sub-config). The harness's
own answer, in a child process without torch or megatron-core: ``perf/test_harness_start.py``."""

from __future__ import annotations

import json

import pytest

from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.config_stages.reading import override_names
from megatron.bridge.training.errors import OverrideError
from megatron.bridge.training.utils.omegaconf_utils import apply_overrides

REFUSED_EARLY = {
    "field-of-a-section": (
        ["train.trian_iters=3"],
        [
            (
                "train.trian_iters",
                3,
                "'train.trian_iters' is not a field of TrainingConfig",
                "did you mean train.train_iters or train.eval_iters?",
            )
        ],
    ),
    "section": (
        ["modle.num_layers=2", "modle.hidden_size=64"],
        [
            (
                "modle",
                {"num_layers": 2, "hidden_size": 64},
                "'modle' is not a field of ConfigContainer",
                "did you mean model?",
            )
        ],
    ),
    "model-field": (
        ["model.num_layerz=2"],
        [
            (
                "model.num_layerz",
                2,
                "'model.num_layerz' is not a field of GPTModelProvider",
                "did you mean model.num_layers",
            )
        ],
    ),
    "megatron-core-section": (
        ["optimizer.lrr=0.1"],
        [("optimizer.lrr", 0.1, "'optimizer.lrr' is not a field of OptimizerConfig", "did you mean optimizer.lr")],
    ),
    "sub-config-of-a-name": (
        ["mixed_precision.grad_reduce_in_fp33=true"],
        [
            (
                "mixed_precision.grad_reduce_in_fp33",
                True,
                "'mixed_precision.grad_reduce_in_fp33' is not a field of MixedPrecisionConfig",
                "did you mean mixed_precision.grad_reduce_in_fp32",
            )
        ],
    ),
    "hydra-add": (
        ["+train.trian_iters=3"],
        [("train.trian_iters", 3, "'train.trian_iters' is not a field of TrainingConfig", "did you mean")],
    ),
    "hydra-force": (
        ["++modle.num_layers=2"],
        [("modle", {"num_layers": 2}, "'modle' is not a field of ConfigContainer", "did you mean model?")],
    ),
    "hydra-delete": (
        ["~train.trian_iters"],
        [
            (
                "train.trian_iters",
                "~train.trian_iters",
                "'train.trian_iters' is not a field of TrainingConfig",
                "did you mean train.train_iters",
            )
        ],
    ),
    "every-one-at-once": (
        ["train.trian_iters=3", "model.num_layers=2", "logger.log_intervall=5"],
        [
            ("train.trian_iters", 3, "'train.trian_iters' is not a field of TrainingConfig", "did you mean"),
            (
                "logger.log_intervall",
                5,
                "'logger.log_intervall' is not a field of LoggerConfig",
                "did you mean logger.log_interval",
            ),
        ],
    ),
}
"""case -> (overrides, [(field, given value, message, start of the fix)])."""

LEFT_TO_THE_FULL_CHECK = {
    "known-names": ["train.train_iters=3", "model.num_layers=2", "mixed_precision=bf16_mixed"],
    "key-of-an-open-dict": ["+tokenizer.hf_tokenizer_kwargs.use_fast=true", "comm_overlap.tp_comm_overlap_cfg.x=1"],
    "alias-of-a-field": ["dataset.data_path=/data/x"],
    "key-under-a-plain-field": ["train.train_iters.x=3"],
    "model-class-named": ["model._target_=megatron.bridge.models.gpt_provider.GPTModelProvider", "model.num_layerz=2"],
    "hydra-delete-of-a-field": ["~train.train_iters"],
    "hydra-add-of-a-field": ["+train.train_iters=3"],
    "malformed-value": ["train.train_iters=[1"],
}
"""case -> overrides the stored names cannot refuse (the full check decides)."""


def _violations(overrides: list[str]) -> list:
    with pytest.raises(OverrideError) as info:
        override_names.check_override_names(overrides)
    return info.value.violations


@pytest.mark.parametrize("case", sorted(REFUSED_EARLY))
def test_a_misspelt_name_is_refused_early_with_the_full_checks_words(case):
    overrides, expected = REFUSED_EARLY[case]
    found = _violations(overrides)
    assert [(v.rule, v.fields, v.values, v.message) for v in found] == [
        ("override-unknown-key", (name,), (value,), message) for name, value, message, _ in expected
    ]
    assert [v.fix.startswith(fix) for v, (*_, fix) in zip(found, expected)] == [True] * len(expected), found


@pytest.mark.parametrize("case", sorted(REFUSED_EARLY))
def test_what_is_refused_early_the_full_check_refuses_too(case):
    overrides, expected = REFUSED_EARLY[case]
    with pytest.raises(OverrideError) as info:
        apply_overrides(qwen3_moe_tiny_pretrain_config(), overrides)
    said = str(info.value)
    assert all(name in said for name, *_ in expected), said


@pytest.mark.parametrize("case", sorted(LEFT_TO_THE_FULL_CHECK))
def test_names_the_stored_schema_cannot_judge_are_left_to_the_full_check(case):
    override_names.check_override_names(LEFT_TO_THE_FULL_CHECK[case])


def test_another_megatron_core_version_leaves_every_name_to_the_full_check(monkeypatch):
    """Its config classes may have other fields than the stored ones."""
    monkeypatch.setattr(override_names, "installed_megatron_core_version", lambda: "0.0.1")
    override_names.check_override_names(["model.num_layerz=2"])


def test_the_stored_names_are_the_config_classes_fields():
    stored = json.loads(override_names.SNAPSHOT_PATH.read_text())
    assert stored == override_names.field_names_snapshot(ConfigContainer), (
        "the config classes changed: run uv run python -m megatron.bridge.training.utils.omegaconf_utils "
        "--write-field-names"
    )
