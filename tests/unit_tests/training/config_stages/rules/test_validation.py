"""Every general rule has a passing and a failing case; all violations are reported together."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from checkpoint_stand_in import saved_checkpoint
from overlap_helpers import violated_rule_ids
from packaging.version import Version

from megatron.bridge.recipes.qwen import qwen3_30b_a3b_pretrain_config, qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.config_stages.facts.checkpoint_dir import model_shape
from megatron.bridge.training.config_stages.resolution.finalize import default_rule_context
from megatron.bridge.training.config_stages.rules.validation import CHECKPOINT_RULES, GENERAL_RULES
from megatron.bridge.training.config_stages.schema.field_ranges import RANGES
from megatron.bridge.training.config_stages.schema.rule_base import check_rules
from megatron.bridge.training.errors import ConfigValidationError
from megatron.bridge.training.loop.save_lock import LOCK_NAME, SaveDirLock
from megatron.bridge.training.mixed_precision import MixedPrecisionConfig

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


INTERLEAVED = {
    "model.pipeline_model_parallel_size": 2,
    "model.virtual_pipeline_model_parallel_size": 2,
    "model.expert_model_parallel_size": 8,
}

# rule id -> (context facts, mutation that breaks the rule, mutation that satisfies it)
CASES = {
    "mixed-precision-known": ({}, _set(mixed_precision="bf17"), _set(mixed_precision=None)),
    "fp8-needs-transformer-engine": (
        TE_ABSENT,
        _set(mixed_precision="bf16_with_fp8_delayed_scaling_mixed"),
        _set(mixed_precision="bf16_mixed"),
    ),
    "fp8-needs-te-layers": (
        TE_PRESENT,
        _set(**{"mixed_precision": "bf16_with_fp8_current_scaling_mixed", "model.layer_spec": "torch_native"}),
        _set(**{"mixed_precision": "bf16_with_fp8_current_scaling_mixed", "model.layer_spec": "auto"}),
    ),
    "mxfp8-needs-blackwell": (
        dict(TE_PRESENT, device_capability=(9, 0)),
        _set(mixed_precision="bf16_with_mxfp8_mixed"),
        _set(mixed_precision="bf16_with_fp8_delayed_scaling_mixed"),
    ),
    "fp4-needs-transformer-engine": (
        TE_ABSENT,
        _set(mixed_precision="bf16_with_nvfp4_mixed"),
        _set(mixed_precision="bf16_mixed"),
    ),
    "fp4-needs-te-layers": (
        dict(TE_PRESENT, device_capability=(10, 0)),
        _set(**{"mixed_precision": "bf16_with_nvfp4_mixed", "model.layer_spec": "torch_native"}),
        _set(**{"mixed_precision": "bf16_with_nvfp4_mixed", "model.layer_spec": "auto"}),
    ),
    "fp4-needs-blackwell": (
        dict(TE_PRESENT, device_capability=(9, 0)),
        _set(mixed_precision="bf16_with_nvfp4_mixed"),
        _set(mixed_precision="bf16_with_fp8_current_scaling_mixed"),
    ),
    "autocast-not-offered": (
        {},
        _set(mixed_precision=MixedPrecisionConfig(bf16=True, autocast_enabled=True)),
        _set(mixed_precision=MixedPrecisionConfig(bf16=True, autocast_enabled=False)),
    ),
    "fp8-param-not-offered": (
        {},
        _set(mixed_precision=MixedPrecisionConfig(bf16=True, fp8_param_gather=True)),
        _set(mixed_precision=MixedPrecisionConfig(bf16=True, fp8_param=False, fp8_param_gather=False)),
    ),
    "own-precision-flags-agree": (
        {},
        _set(**{"mixed_precision": None, "model.bf16": True}),
        _set(**{"mixed_precision": None, "model.bf16": True, "optimizer.bf16": True}),
    ),
    "dataset-files-exist": (
        {},
        _set(**{"dataset.data_path": "/nonexistent/corpus_text_document"}),
        _set(**{"dataset.data_path": None}),
    ),
    "hf-tokenizer-kwargs-need-hf-tokenizer": (
        {},
        _set(**{"tokenizer.hf_tokenizer_kwargs": {"use_fast": True}}),
        _set(
            **{
                "tokenizer.hf_tokenizer_kwargs": {"use_fast": True},
                "tokenizer.tokenizer_type": "HuggingFaceTokenizer",
                "tokenizer.tokenizer_model": "Qwen/Qwen3-30B-A3B",
            }
        ),
    ),
    "te-rng-tracker-needs-transformer-engine": (
        TE_ABSENT,
        _set(**{"rng.te_rng_tracker": True}),
        _set(**{"rng.te_rng_tracker": False}),
    ),
    "layer-spec-known": ({}, _set(**{"model.layer_spec": "triton"}), _set(**{"model.layer_spec": "local"})),
    "te-layer-spec-needs-transformer-engine": (
        TE_ABSENT,
        _set(**{"model.layer_spec": "transformer_engine"}),
        _set(**{"model.layer_spec": "auto"}),
    ),
    "cross-entropy-impl-known": (
        {},
        _set(**{"model.cross_entropy_fusion_impl": "apex"}),
        _set(**{"model.cross_entropy_fusion_impl": "native"}),
    ),
    "te-cross-entropy-needs-transformer-engine": (
        TE_ABSENT,
        _set(**{"model.cross_entropy_loss_fusion": True, "model.cross_entropy_fusion_impl": "te"}),
        _set(**{"model.cross_entropy_loss_fusion": True, "model.cross_entropy_fusion_impl": "torch_native"}),
    ),
    "te-cross-entropy-stability": (
        TE_PRESENT,
        _set(**{"model.cross_entropy_loss_fusion": True, "model.cross_entropy_fusion_impl": "te"}),
        _set(**{"model.cross_entropy_loss_fusion": True, "model.cross_entropy_fusion_impl": "torch_native"}),
    ),
    "lr-warmup-shorter-than-decay": (
        {},
        _set(**{"scheduler.lr_warmup_iters": 500, "scheduler.lr_decay_iters": None, "train.train_iters": 8}),
        _set(**{"scheduler.lr_warmup_iters": 500, "scheduler.lr_decay_iters": 300_000, "train.train_iters": 8}),
    ),
    "micro-batch-divides-global-batch": (
        {},
        _set(**{"train.global_batch_size": 10, "train.micro_batch_size": 4}),
        _set(**{"train.global_batch_size": 12, "train.micro_batch_size": 4}),
    ),
    "layout-divides-world-size": (
        dict(world_size=12),
        _set(**{"model.expert_model_parallel_size": 1, "model.tensor_model_parallel_size": 8}),
        _set(**{"model.expert_model_parallel_size": 1, "model.tensor_model_parallel_size": 4}),
    ),
    "expert-layout-divides-world-size": (
        dict(world_size=24),
        _set(**{"model.expert_model_parallel_size": 16}),
        _set(**{"model.expert_model_parallel_size": 8}),
    ),
    "data-parallel-divides-global-batch": (
        dict(world_size=16),
        _set(**{"train.global_batch_size": 24}),
        _set(**{"train.global_batch_size": 32}),
    ),
    "experts-divisible-by-ep": (
        {},
        _set(**{"model.expert_model_parallel_size": 3}),
        _set(**{"model.expert_model_parallel_size": 4}),
    ),
    "ep-needs-moe": ({}, _set(**{"model.num_moe_experts": None}), _set(**{"model.expert_model_parallel_size": 1})),
    "sequence-parallel-needs-tp": (
        {},
        _set(**{"model.sequence_parallel": True}),
        _set(**{"model.sequence_parallel": True, "model.tensor_model_parallel_size": 2}),
    ),
    "layers-divisible-by-pipeline": (
        {},
        _set(**{"model.pipeline_model_parallel_size": 5}),
        _set(**{"model.pipeline_model_parallel_size": 4}),
    ),
    "vocab-size-set": ({}, _set(**{"model.vocab_size": None}), _set(**{"model.vocab_size": 32000})),
    "tokenizer-vocab-fits-model": (
        {},
        _set(**{"tokenizer.vocab_size": 151937}),
        _set(**{"tokenizer.vocab_size": 151936}),
    ),
    "hf-tokenizer-needs-model": (
        {},
        _set(**{"tokenizer.tokenizer_type": "HuggingFaceTokenizer"}),
        _set(**{"tokenizer.tokenizer_type": "HuggingFaceTokenizer", "tokenizer.tokenizer_model": "/tok"}),
    ),
    "steady-state-window": (
        {},
        _set(**{"logger.steady_state_window": [8, 3]}),
        _set(**{"logger.steady_state_window": [2, 4]}),
    ),
    "cpu-mode-needs-gloo": (
        {},
        _set(**{"dist.device": "cpu", "dist.distributed_backend": "nccl"}),
        _set(**{"dist.device": "cpu", "dist.distributed_backend": None}),
    ),
    "save-interval-needs-save-dir": (
        {},
        _set(**{"checkpoint.save_interval": 5}),
        _set(**{"checkpoint.save_interval": 5, "checkpoint.save": "/tmp/ckpt"}),
    ),
    "profile-steps-ordered": (
        {},
        _set(
            **{
                "profiling.use_pytorch_profiler": True,
                "profiling.profile_step_start": 6,
                "profiling.profile_step_end": 5,
            }
        ),
        _set(**{"profiling.use_pytorch_profiler": True}),
    ),
    "gpu-park-steps-after-window": (
        {},
        _set(**{"train.train_iters": 14, "logger.steady_state_window": [4, 12], "profiling.gpu_park_steps": [12]}),
        _set(**{"train.train_iters": 14, "logger.steady_state_window": [4, 12], "profiling.gpu_park_steps": [13, 14]}),
    ),
    "gpu-park-needs-cuda": (
        {},
        _set(
            **{
                "train.train_iters": 14,
                "logger.steady_state_window": [4, 12],
                "profiling.gpu_park_steps": [13],
                "dist.device": "cpu",
                "dist.distributed_backend": None,
            }
        ),
        _set(**{"train.train_iters": 14, "logger.steady_state_window": [4, 12], "profiling.gpu_park_steps": [13]}),
    ),
    "min-lr-not-above-lr": (
        {},
        _set(**{"optimizer.lr": 1e-4, "optimizer.min_lr": 1e-3}),
        _set(**{"optimizer.min_lr": 1e-5}),
    ),
    "router-topk-within-experts": ({}, _set(**{"model.moe_router_topk": 129}), _set(**{"model.moe_router_topk": 128})),
    # PP2 x VPP2 on 16 GPUs with EP8: DP 8, micro-batch 1 -> M = global / 8 micro-batches per step.
    "interleaved-pipeline-micro-batches": (
        dict(world_size=16),
        _set(**INTERLEAVED, **{"train.global_batch_size": 24}),
        _set(**INTERLEAVED, **{"train.global_batch_size": 32}),
    ),
    "mtp-not-built": ({}, _set(**{"model.mtp_num_layers": 1}), _set(**{"model.mtp_num_layers": None})),
    "cpu-mode-no-flex-dispatcher": (
        {},
        _set(
            **{
                "dist.device": "cpu",
                "model.moe_token_dispatcher_type": "flex",
                "model.moe_flex_dispatcher_backend": "deepep",
            }
        ),
        _set(**{"dist.device": "cpu"}),
    ),
}

CHECKPOINT_RULE_IDS = {rule.id for rule in CHECKPOINT_RULES}
RANGE_RULE_IDS = {r.rule_id for r in RANGES}


def test_every_general_rule_has_cases():
    assert set(CASES) | CHECKPOINT_RULE_IDS | RANGE_RULE_IDS == {rule.id for rule in GENERAL_RULES}
    assert set(CHECKPOINT_CASES) == CHECKPOINT_RULE_IDS


def _violated_ids(cfg, facts):
    return violated_rule_ids(GENERAL_RULES, cfg, facts)


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
    assert {v.rule for v in err.violations} >= {"range:train.train_iters", "vocab-size-set", "steady-state-window"}
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


# ------------------------------------------------------------------------------------------ ranges
@pytest.mark.parametrize("field_range", RANGES, ids=lambda r: r.field)
def test_value_outside_its_range_is_refused_with_the_range(field_range):
    cfg = _set(**{field_range.field: field_range.example_outside()})(qwen3_30b_a3b_pretrain_config())
    violations = [
        v for v in check_rules(GENERAL_RULES, cfg, default_rule_context(world_size=16)) if v.rule == field_range.rule_id
    ]
    assert len(violations) == 1
    assert field_range.describe() in violations[0].message and field_range.field in violations[0].fix


@pytest.mark.parametrize("field_range", RANGES, ids=lambda r: r.field)
def test_recipe_value_is_inside_its_range(field_range):
    cfg = qwen3_30b_a3b_pretrain_config()
    assert field_range.rule_id not in _violated_ids(cfg, dict(world_size=16))


@pytest.mark.parametrize(
    "changes",
    [
        {"model.tensor_model_parallel_size": 0},
        {"model.pipeline_model_parallel_size": 0, "model.virtual_pipeline_model_parallel_size": 0},
        {"train.micro_batch_size": 0},
        {"model.expert_model_parallel_size": -2},
        {"model.seq_length": "long"},
    ],
)
def test_out_of_range_sizes_give_a_violation_not_a_crash(changes):
    """Rules that divide by a size skip it when its range rule already reports it."""
    cfg = _set(**changes)(qwen3_30b_a3b_pretrain_config())
    ids = _violated_ids(cfg, dict(world_size=16))
    assert {f"range:{field}" for field in changes} <= ids


def test_seq_length_and_lr_below_zero_are_refused_by_validate():
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.model.seq_length = -1
    cfg.optimizer.lr = -1.0
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate(world_size=1)
    assert {"range:model.seq_length", "range:optimizer.lr"} <= {v.rule for v in info.value.violations}
    assert "model.seq_length=-1" in str(info.value) and "optimizer.lr=-1.0" in str(info.value)


def test_interleaved_rule_matches_megatron_core_0_19_2():
    """P <= N <= M and (M % N == 0 or M % N >= P), N defaulting to P."""
    from megatron.bridge.training.config_stages.rules.validation import interleaved_schedule_accepts
    from megatron.bridge.training.config_stages.schema.rule_base import RuleContext

    def accepts(gbs, group=None):
        cfg = _set(**INTERLEAVED, **{"train.global_batch_size": gbs})(qwen3_30b_a3b_pretrain_config())
        cfg.model.pipeline_model_parallel_size = 4
        cfg.model.microbatch_group_size_per_vp_stage = group
        return interleaved_schedule_accepts(cfg, RuleContext(world_size=32))  # DP = 32 / 4 = 8

    assert [m for m in range(1, 13) if accepts(8 * m)] == [4, 8, 12]  # N = P = 4: multiples of 4
    assert [m for m in range(1, 13) if accepts(8 * m, group=5)] == [5, 9, 10]  # 5 <= M; M % 5 in {0} or >= 4


# ------------------------------------------------------------------------------------------ checkpoints
SAVED_EP8 = dict(tp=1, pp=1, vpp=None, cp=1, ep=8, etp=1, dp=16, model=model_shape(qwen3_30b_a3b_pretrain_config()))
WITHOUT_MODEL = {k: v for k, v in SAVED_EP8.items() if k != "model"}
"""A record as written before checkpoints recorded the model's shape."""


def _tracker_dir(root, iteration=4, layout=SAVED_EP8, drop=()):
    """A checkpoint directory with what a resume reads of its latest iteration (``drop``: files left out)."""
    return saved_checkpoint(root, iteration, layout, drop)


def _dir_with(tmp, name, *files):
    path = tmp / name
    path.mkdir()
    for file in files:
        (path / file).write_text("x")
    return path


def _missing_iteration(tmp):
    root = _tracker_dir(tmp / "ck", 4)
    shutil.rmtree(root / "iter_0000004")
    return root


# rule id -> (load directory that breaks the rule, (load, save) that satisfy it), built under tmp_path
CHECKPOINT_CASES = {
    "checkpoint-load-exists": (lambda tmp: tmp / "typo", lambda tmp: (_tracker_dir(tmp / "ck"), None)),
    "checkpoint-load-empty-needs-save-there": (
        lambda tmp: _dir_with(tmp, "empty"),
        lambda tmp: (_dir_with(tmp, "empty"),) * 2,
    ),
    "checkpoint-load-is-iteration-dir": (
        lambda tmp: _tracker_dir(tmp / "ck") / "iter_0000004",
        lambda tmp: (_tracker_dir(tmp / "ck"), None),
    ),
    "checkpoint-load-has-tracker": (
        lambda tmp: _dir_with(tmp, "other", "notes.txt"),
        lambda tmp: (_tracker_dir(tmp / "ck"), None),
    ),
    "checkpoint-load-tracker-names-saved-iteration": (
        _missing_iteration,
        lambda tmp: (_tracker_dir(tmp / "ck", 4), None),
    ),
    "resume-same-parallel-layout": (
        lambda tmp: _tracker_dir(tmp / "ck", layout={**SAVED_EP8, "ep": 16}),
        lambda tmp: (_tracker_dir(tmp / "ck", layout=SAVED_EP8), None),
    ),
    "checkpoint-load-complete": (
        lambda tmp: _tracker_dir(tmp / "ck", drop=("rng/rank_00001.pt",)),
        lambda tmp: (_tracker_dir(tmp / "ck"), None),
    ),
    "checkpoint-save-not-in-use": (
        lambda tmp: (_tracker_dir(tmp / "ck"), _held_by_another_run(tmp / "save")),
        lambda tmp: (_tracker_dir(tmp / "ck"), tmp / "save"),
    ),
    "checkpoint-save-writable": (
        lambda tmp: (_tracker_dir(tmp / "ck"), _a_file(tmp)),
        lambda tmp: (_tracker_dir(tmp / "ck"), tmp / "new" / "dir"),
    ),
    "checkpoint-save-not-another-runs": (
        lambda tmp: (_tracker_dir(tmp / "ck"), _tracker_dir(tmp / "other_run", iteration=50)),
        lambda tmp: (_tracker_dir(tmp / "ck"), tmp / "ck"),
    ),
    "checkpoint-load-path-not-empty": (lambda tmp: "", lambda tmp: (_tracker_dir(tmp / "ck"), None)),
    "checkpoint-save-path-not-empty": (
        lambda tmp: (_tracker_dir(tmp / "ck"), " "),
        lambda tmp: (_tracker_dir(tmp / "ck"), tmp / "new"),
    ),
    "checkpoint-save-lock-usable": (
        lambda tmp: (_tracker_dir(tmp / "ck"), _with_lock_dir(tmp / "save")),
        lambda tmp: (_tracker_dir(tmp / "ck"), tmp / "save"),
    ),
    "checkpoint-save-entries-yours": (
        lambda tmp: (_tracker_dir(tmp / "ck"), _with_link(tmp / "save")),
        lambda tmp: (_tracker_dir(tmp / "ck"), tmp / "save"),
    ),
    "checkpoint-load-entries-yours": (
        lambda tmp: _with_link(_tracker_dir(tmp / "ck"), "notes"),
        lambda tmp: (_tracker_dir(tmp / "ck"), None),
    ),
    "checkpoint-layout-record-valid": (
        lambda tmp: _tracker_dir(tmp / "ck", layout={}),
        lambda tmp: (_tracker_dir(tmp / "ck"), None),
    ),
    "resume-same-model-shape": (
        lambda tmp: _tracker_dir(tmp / "ck", layout={**SAVED_EP8, "model": {**SAVED_EP8["model"], "num_layers": 4}}),
        lambda tmp: (_tracker_dir(tmp / "ck"), None),
    ),
    "checkpoint-records-model-shape": (
        lambda tmp: _tracker_dir(tmp / "ck", layout=WITHOUT_MODEL),
        lambda tmp: (_tracker_dir(tmp / "ck"), None),
    ),
}


_HELD: list[SaveDirLock] = []


def _held_by_another_run(save):
    """A save directory whose lock a live run holds (this test process, through an open file of its
    own: to the rule, another run)."""
    _HELD.append(SaveDirLock(save).acquire())
    return save


def _with_lock_dir(save):
    (save / LOCK_NAME).mkdir(parents=True)
    return save


def _with_link(directory, name="latest_checkpointed_iteration.txt.tmp"):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).symlink_to(directory.parent / "elsewhere")
    return directory


def _a_file(tmp):
    (tmp / "taken").write_text("x")
    return tmp / "taken"


def _checkpoint_cfg(load, save=None):
    cfg = qwen3_30b_a3b_pretrain_config()
    cfg.model.expert_model_parallel_size = 8
    cfg.checkpoint.load = str(load)
    cfg.checkpoint.save = str(save) if save else None
    return cfg


@pytest.mark.parametrize("rule_id", sorted(CHECKPOINT_CASES))
def test_checkpoint_rule_negative_case_is_reported(rule_id, tmp_path):
    broken = CHECKPOINT_CASES[rule_id][0](tmp_path)
    load, save = broken if isinstance(broken, tuple) else (broken, None)
    assert rule_id in _violated_ids(_checkpoint_cfg(load, save), dict(world_size=16))


@pytest.mark.parametrize("rule_id", sorted(CHECKPOINT_CASES))
def test_checkpoint_rule_positive_case_passes(rule_id, tmp_path):
    load, save = CHECKPOINT_CASES[rule_id][1](tmp_path)
    ids = _violated_ids(_checkpoint_cfg(load, save), dict(world_size=16))
    assert not ids & CHECKPOINT_RULE_IDS, ids


def test_layout_violation_shows_saved_and_current_layout(tmp_path):
    load = _tracker_dir(tmp_path / "ck", layout={**SAVED_EP8, "ep": 16})
    ctx = dataclasses.replace(default_rule_context(), world_size=16)
    (violation,) = [v for v in check_rules(CHECKPOINT_RULES, _checkpoint_cfg(load), ctx)]
    text = violation.format()
    assert "saved_layout=" in text and "'ep': 16" in text and "current_layout=" in text and "'ep': 8" in text


@pytest.mark.parametrize("name", ["ck", "iter_runs"])
def test_leftover_of_a_killed_first_save_counts_as_empty(tmp_path, name):
    (tmp_path / name / "iter_0000002.incomplete").mkdir(parents=True)
    (tmp_path / name / ".latest_checkpointed_iteration.txt.5e1f0a2b9c3d.tmp").write_text("2")  # replace_file's
    cfg = _checkpoint_cfg(tmp_path / name, tmp_path / name)
    assert not _violated_ids(cfg, dict(world_size=16)) & CHECKPOINT_RULE_IDS


def test_reliability_page_lists_every_range():
    from megatron.bridge.training.config_stages.schema.field_ranges import DOCS_PATH, render_docs

    page = (Path(__file__).resolve().parents[5] / DOCS_PATH).read_text()
    assert page == render_docs(page), (
        "run: uv run python -m megatron.bridge.training.config_stages.schema.field_ranges --write-docs"
    )


def _layout_text(ck: Path, text: str) -> None:
    (ck / "iter_0000004" / "parallel_layout.json").write_text(text)


def _fifo(path: Path) -> None:
    """A named pipe in place of a file (reading it waited for a writer forever)."""
    import os

    path.unlink()
    os.mkfifo(path)


def _record(ck: Path, keep=tuple(SAVED_EP8), **changes) -> None:
    """The latest checkpoint's layout record with only the keys in ``keep``, then ``changes``."""
    _layout_text(ck, json.dumps({**{k: SAVED_EP8[k] for k in keep}, **changes}))


@pytest.mark.parametrize(
    "damage, words",
    [
        (
            lambda ck: (ck / "latest_checkpointed_iteration.txt").write_bytes(b"\xff\xfe\x00garbage"),
            "checkpoint-load-has-tracker",
        ),
        (lambda ck: (ck / "latest_checkpointed_iteration.txt").write_text("²"), "checkpoint-load-has-tracker"),
        (lambda ck: (ck / "iter_0000004" / "rng" / "rank_00001.pt").unlink(), "rng/rank_00001.pt"),
        (lambda ck: (ck / "iter_0000004" / "parallel_layout.json").unlink(), "parallel_layout.json"),
        (lambda ck: (ck / "iter_0000004" / ".metadata").unlink(), ".metadata"),
        (lambda ck: (ck / "latest_checkpointed_iteration.txt").write_text("9" * 5000), "more than 12 characters"),
        (lambda ck: _record(ck, dp=10**12), "tp*pp*cp*dp = 1000000000000 ranks, more than any run has"),
        (lambda ck: _record(ck, keep=()), "tp is missing"),
        (lambda ck: _record(ck, tp=True), "tp=True is not a positive integer"),
        (lambda ck: _record(ck, vpp=0), "vpp=0 is neither null nor a positive integer"),
        (lambda ck: _record(ck, model=3), "model=3 is not a JSON object"),
        (lambda ck: _record(ck, ep=3), "ep*etp*pp = 3 does not divide the 16 ranks"),
        (lambda ck: _record(ck, dp=8), "rng/ holds rank_00008.pt: the record does not match the files"),
        (lambda ck: _layout_text(ck, "[1, 2]"), "parallel_layout.json holds [1, 2], not a JSON object"),
        (lambda ck: _layout_text(ck, "{"), "parallel_layout.json is not JSON"),
        (lambda ck: _layout_text(ck, "[" * 50_000), "parallel_layout.json is not JSON"),
        (lambda ck: _layout_text(ck, " " * 70_000), "larger than 64 KiB"),
        (lambda ck: _fifo(ck / "iter_0000004" / "parallel_layout.json"), "parallel_layout.json cannot be read (not a"),
        (
            lambda ck: [(ck / "iter_0000004" / "rng" / f"rank_{r:05d}.pt").unlink() for r in range(1, 16)],
            "'rng/rank_00008.pt', \"... and 7 more of 16 ranks' RNG files\"]",
        ),
    ],
)
def test_a_damaged_checkpoint_is_refused_naming_what_is_wrong(tmp_path, damage, words):
    """Through ``validate()`` (what the harness runs before launch): never a traceback, a hang (a record of
    10**12 ranks was one file check per rank), a silent skip (``{}`` skipped the layout and RNG checks),
    a fresh start or an unbounded message."""
    ck = _tracker_dir(tmp_path / "ck")
    damage(ck)
    cfg = _checkpoint_cfg(ck)
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate(world_size=16)
    assert words in str(info.value)


def test_the_recorded_model_shape_is_the_one_compared_before_launch():
    """The record is written from the config the ranks train (after megatron-core's ``__post_init__``
    filled its defaults) and compared against the user's config before it: both give one shape."""
    from megatron.bridge.training.config_stages.facts.checkpoint_dir import checkpoint_layout
    from megatron.bridge.training.config_stages.resolution.finalize import resolve_config

    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.model.num_query_groups = cfg.model.kv_channels = cfg.model.moe_ffn_hidden_size = None
    trained = resolve_config(cfg, world_size=1).raise_for_errors().config
    assert (trained.model.num_query_groups, trained.model.kv_channels) == (4, 32)  # megatron-core's defaults
    record = json.loads(json.dumps(checkpoint_layout(trained, 1)))
    assert record["model"] == model_shape(cfg) and record["model"]["moe_ffn_hidden_size"] == 256


# ------------------------------------------------------------------------------------------ Python values
def _bad_values(r):
    """Values of the wrong kind for a range's field, as a script can set them: text, a list, a value
    outside the range, and a float where a whole number is needed."""
    values = ["2", [1], r.example_outside()]
    return values + ([1e30, 2.5] if r.integer else [])


@pytest.mark.parametrize(
    "field, value", [(r.field, v) for r in RANGES for v in _bad_values(r)], ids=lambda x: repr(x)[:24]
)
def test_validate_lists_a_value_of_the_wrong_kind_instead_of_crashing(field, value):
    """``cfg.model.expert_model_parallel_size = "2"`` was a ``TypeError`` from inside validate()."""
    cfg = _set(**{field: value})(qwen3_moe_tiny_pretrain_config())
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate(world_size=2)
    assert f"range:{field}" in {v.rule for v in info.value.violations}


@pytest.mark.parametrize("world_size", [0, -1, "2", 2.0, True], ids=repr)
def test_validate_lists_a_world_size_that_is_not_a_positive_whole_number(world_size):
    """``world_size=0`` was a ``ZeroDivisionError`` and ``world_size="2"`` a ``TypeError``."""
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.model.expert_model_parallel_size = 0  # another problem: both are listed at once
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate(world_size=world_size)
    assert {"world-size-positive", "range:model.expert_model_parallel_size"} <= {v.rule for v in info.value.violations}


@pytest.mark.parametrize("profiler", ["use_pytorch_profiler", "use_host_profiler"])
def test_either_profiler_needs_an_ordered_window(profiler):
    window = {"profiling.profile_step_start": 6, "profiling.profile_step_end": 5}
    cfg = _set(**{f"profiling.{profiler}": True, **window})(qwen3_30b_a3b_pretrain_config())
    assert "profile-steps-ordered" in _violated_ids(cfg, {})
    assert "profile-steps-ordered" not in _violated_ids(_set(**window)(qwen3_30b_a3b_pretrain_config()), {})
