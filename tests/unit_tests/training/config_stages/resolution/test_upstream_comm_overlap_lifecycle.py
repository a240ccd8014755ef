"""The overlap lifecycle Megatron-Bridge scripts call: ``comm_overlap.finalize()``, ``setup(model,
optimizer, ddp)`` and ``runtime_config_update(cfg)``. Each gives the megatron-core configs exactly the
values ``cfg.resolve()`` gives them, and the case without the distributed optimizer leaves the
data-parallel overlaps at megatron-core's defaults, as upstream does."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from megatron.bridge.recipes.qwen import (
    qwen3_30b_a3b_pretrain_8gpu_config,
    qwen3_30b_a3b_pretrain_config,
    qwen3_moe_tiny_pretrain_config,
)
from megatron.bridge.training.comm_overlap import CommOverlapConfig
from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.config_stages.facts.overlap_fields import OVERLAP_FIELDS
from megatron.bridge.training.config_stages.resolution.runtime_config import runtime_config_update
from megatron.bridge.training.config_stages.schema.rule_base import read_field
from megatron.bridge.training.errors import CommOverlapConfigError, ConfigValidationError

COPIES = [(spec.name, target) for spec in OVERLAP_FIELDS for target in spec.targets]
"""Every megatron-core field an overlap switch is written to, with its switch."""


@dataclass(frozen=True)
class Case:
    """A recipe, the GPUs it runs on and the edits a script makes to it."""

    name: str
    recipe: Callable[[], ConfigContainer]
    world_size: int
    edits: dict[str, Any] = field(default_factory=dict)

    def build(self) -> ConfigContainer:
        cfg = self.recipe()
        for dotted, value in self.edits.items():
            holder, _, attr = dotted.rpartition(".")
            setattr(read_field(cfg, holder), attr, value)
        return cfg

    def data_parallel_size(self, cfg: ConfigContainer) -> int:
        m = cfg.model
        return self.world_size // (
            m.tensor_model_parallel_size * m.pipeline_model_parallel_size * m.context_parallel_size
        )


NO_DIST_OPT = {"ddp.use_distributed_optimizer": False, "optimizer.use_distributed_optimizer": False}

CASES = [
    Case("tiny on one GPU", qwen3_moe_tiny_pretrain_config, 1),
    Case("tiny, DP 4", qwen3_moe_tiny_pretrain_config, 4),
    Case(
        "tiny, EP 2 with EP overlap",
        qwen3_moe_tiny_pretrain_config,
        2,
        {
            "model.num_layers": 4,
            "model.expert_model_parallel_size": 2,
            "comm_overlap.overlap_moe_expert_parallel_comm": True,
        },
    ),
    Case("30B-A3B on 32 GPUs", qwen3_30b_a3b_pretrain_config, 32),
    Case("30B-A3B 8-GPU layout (PP 2, no VPP)", qwen3_30b_a3b_pretrain_8gpu_config, 8),
    Case(
        "30B-A3B 8-GPU layout, interleaved, DP 2",
        qwen3_30b_a3b_pretrain_8gpu_config,
        16,
        {"model.virtual_pipeline_model_parallel_size": 2},
    ),
    Case(
        "explicit switches win",
        qwen3_moe_tiny_pretrain_config,
        4,
        {"comm_overlap.overlap_param_gather": False, "comm_overlap.bucket_size": 1 << 20},
    ),
    Case("no distributed optimizer", qwen3_moe_tiny_pretrain_config, 4, NO_DIST_OPT),
    Case(
        "no distributed optimizer, grad reduce asked for",
        qwen3_moe_tiny_pretrain_config,
        4,
        {**NO_DIST_OPT, "comm_overlap.overlap_grad_reduce": True},
    ),
]


def copies(cfg: ConfigContainer) -> dict[str, Any]:
    """What megatron-core will read: every copy of an overlap switch."""
    return {target: read_field(cfg, target) for _, target in COPIES}


def resolved_copies(cfg: ConfigContainer, world_size: int) -> dict[str, Any]:
    """The values the one resolution decides for ``cfg`` (left unchanged) on ``world_size`` GPUs."""
    values = copy.deepcopy(cfg).resolve(world_size=world_size).values
    return {target: values[name].value for name, target in COPIES}


def owners(cfg: ConfigContainer) -> dict[str, Any]:
    return {f.name: getattr(cfg.comm_overlap, f.name) for f in dataclasses.fields(CommOverlapConfig)}


@pytest.fixture(autouse=True)
def no_world_size_env(monkeypatch):
    """Each test states its GPU count; none is read from the environment unless a test sets it."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_finalize_then_setup_writes_what_resolve_decides(case: Case) -> None:
    cfg = case.build()
    expected = resolved_copies(cfg, case.world_size)
    cfg.comm_overlap.data_parallel_size = case.data_parallel_size(cfg)  # as upstream's runtime step does
    before = owners(cfg)
    cfg.comm_overlap.finalize()
    values = cfg.comm_overlap.setup(cfg.model, cfg.optimizer, cfg.ddp)
    assert copies(cfg) == expected
    assert {target: values[name].value for name, target in COPIES} == expected
    assert owners(cfg) == before  # the switches stay as the script wrote them
    cfg.validate(world_size=case.world_size)
    assert copies(cfg) == expected


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_runtime_config_update_writes_what_resolve_decides(case: Case) -> None:
    cfg = case.build()
    expected = resolved_copies(cfg, case.world_size)
    runtime_config_update(cfg, world_size=case.world_size)
    assert copies(cfg) == expected
    assert cfg.comm_overlap.data_parallel_size == case.data_parallel_size(cfg)


@pytest.mark.parametrize("world_size, layout, dp", [("8", (1, 1, 1), 8), ("16", (4, 2, 1), 2), ("32", (2, 2, 2), 4)])
def test_runtime_config_update_reads_the_world_size_and_writes_data_parallel_size(
    world_size: str, layout: tuple[int, int, int], dp: int, monkeypatch
) -> None:
    cfg = qwen3_30b_a3b_pretrain_8gpu_config()
    m = cfg.model
    m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size = layout
    m.sequence_parallel = layout[0] > 1
    m.expert_model_parallel_size = 1
    m.num_layers = 2  # without expert parallelism one GPU holds two of the 48 layers' experts, not all
    monkeypatch.setenv("WORLD_SIZE", world_size)
    resolution = runtime_config_update(cfg)
    assert cfg.comm_overlap.data_parallel_size == dp
    assert resolution.values["overlap_grad_reduce"].value is (dp > 1)


def test_runtime_config_update_refuses_a_layout_that_does_not_divide_the_gpus() -> None:
    cfg = qwen3_30b_a3b_pretrain_8gpu_config()  # TP 4 x PP 2
    with pytest.raises(ConfigValidationError) as info:
        runtime_config_update(cfg, world_size=12)
    assert "layout-divides-world-size" in {v.rule for v in info.value.violations}
    assert cfg.comm_overlap.data_parallel_size is None


def test_without_distributed_optimizer_dp_overlaps_keep_megatron_defaults() -> None:
    """As upstream: without the distributed optimizer setup leaves grad-reduce/param-gather off."""
    cfg = Case("", qwen3_moe_tiny_pretrain_config, 4, NO_DIST_OPT).build()
    cfg.comm_overlap.data_parallel_size = 4
    cfg.comm_overlap.setup(cfg.model, cfg.optimizer, cfg.ddp)
    assert (cfg.ddp.overlap_grad_reduce, cfg.ddp.overlap_param_gather, cfg.ddp.align_param_gather) == (False,) * 3
    assert (cfg.optimizer.overlap_param_gather, cfg.ddp.bucket_size) == (False, None)


def test_setup_without_data_parallel_size_leaves_dp_overlap_off_as_resolve_does() -> None:
    cfg = qwen3_moe_tiny_pretrain_config()
    expected = {t: v.value for t, v in _resolve_values_by_target(cfg).items()}
    values = cfg.comm_overlap.setup(cfg.model, cfg.optimizer, cfg.ddp)
    assert copies(cfg) == expected
    assert "data-parallel size unknown" in values["overlap_grad_reduce"].detail


def _resolve_values_by_target(cfg: ConfigContainer) -> dict[str, Any]:
    values = copy.deepcopy(cfg).resolve().values
    return {target: values[name] for name, target in COPIES}


def test_setup_reads_the_process_group_backend_when_given() -> None:
    """Gloo between ranks on GPUs runs DP collectives synchronously: no overlap, as resolve says."""
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.dist.distributed_backend = "gloo"
    expected = resolved_copies(cfg, 4)
    cfg.comm_overlap.data_parallel_size = 4
    cfg.comm_overlap.setup(cfg.model, cfg.optimizer, cfg.ddp, dist_config=cfg.dist)
    assert copies(cfg) == expected and cfg.ddp.overlap_grad_reduce is False


def test_setup_refuses_to_overwrite_a_copy_set_directly() -> None:
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.comm_overlap.data_parallel_size = 1
    cfg.ddp.overlap_grad_reduce = True  # the copy, not its owner comm_overlap.overlap_grad_reduce
    with pytest.raises(CommOverlapConfigError) as info:
        cfg.comm_overlap.setup(cfg.model, cfg.optimizer, cfg.ddp)
    (violation,) = info.value.violations
    assert violation.rule == "owned-field-set-directly"
    assert violation.fields == ("ddp.overlap_grad_reduce", "comm_overlap.overlap_grad_reduce")
    assert "comm_overlap.overlap_grad_reduce=true" in violation.fix
    assert cfg.ddp.overlap_grad_reduce is True and cfg.ddp.bucket_size is None  # nothing written


def test_setup_twice_follows_an_edited_switch() -> None:
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.comm_overlap.data_parallel_size = 4
    cfg.comm_overlap.setup(cfg.model, cfg.optimizer, cfg.ddp)
    cfg.comm_overlap.overlap_grad_reduce = False
    cfg.comm_overlap.setup(cfg.model, cfg.optimizer, cfg.ddp)
    assert cfg.ddp.overlap_grad_reduce is False and cfg.ddp.overlap_param_gather is True


@pytest.mark.parametrize(
    "name, value, rule",
    [
        ("overlap_grad_reduce", 1, "overlap-switch-is-bool:overlap_grad_reduce"),
        ("overlap_moe_expert_parallel_comm", "yes", "overlap-switch-is-bool:overlap_moe_expert_parallel_comm"),
        ("tp_comm_bootstrap_backend", "ucx", "tp-comm-bootstrap-backend-known"),
        ("data_parallel_size", 0, "data-parallel-size-matches-layout"),
    ],
)
def test_finalize_refuses_values_that_cannot_work(name: str, value: Any, rule: str) -> None:
    overlap = CommOverlapConfig(**{name: value})
    with pytest.raises(CommOverlapConfigError) as info:
        overlap.finalize()
    (violation,) = info.value.violations
    assert violation.rule == rule and violation.values[0] == value
    assert f"comm_overlap.{name}" in violation.fields[0] and violation.fix


def test_finalize_is_idempotent_and_keeps_framework_decides() -> None:
    overlap = CommOverlapConfig(overlap_moe_expert_parallel_comm=True)
    before = dataclasses.asdict(overlap)
    overlap.finalize()
    overlap.finalize()
    assert dataclasses.asdict(overlap) == before
