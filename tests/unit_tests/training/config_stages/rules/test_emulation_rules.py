"""What an emulated world cannot play is refused by ``validate()`` before launch, each with its rule."""

from __future__ import annotations

import pytest

from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.config_stages.rules.emulation_rules import EMULATION_RULES
from megatron.bridge.training.errors import ConfigValidationError


def emulated(**changes):
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.dist.device = "cpu"
    cfg.model.expert_model_parallel_size = 4
    cfg.emulation.world_size = 4
    for dotted, value in changes.items():
        section, name = dotted.split(".")
        setattr(getattr(cfg, section), name, value)
    return cfg


CASES = {
    "emulation-network-known": {"emulation.network": "h100_ib800"},
    "emulation-rank-in-world": {"emulation.rank": 4},
    "emulation-no-checkpoints": {"checkpoint.save": "/tmp/somewhere"},
    "emulation-no-pipeline-parallel": {"model.pipeline_model_parallel_size": 2},
    "emulation-no-context-parallel": {"model.context_parallel_size": 2},
    "emulation-no-flex-dispatcher": {"model.moe_token_dispatcher_type": "flex"},
    "emulation-no-nvshmem-blocks": {
        "model.torch_native_dispatcher": "sorted",
        "model.torch_native_ep_transport": "nvshmem",
        "model.torch_native_nvshmem_blocks": 8,
    },
    "emulation-no-gloo-on-gpus": {"dist.device": "cuda", "dist.distributed_backend": "gloo"},
    # a real world (no emulation.world_size) with a figure of the network model, which nothing would read
    "emulation-settings-need-an-emulated-world": {"emulation.world_size": None, "emulation.inter_node_gbps": 25.0},
}


def test_every_emulation_rule_has_a_case():
    assert set(CASES) == {rule.id for rule in EMULATION_RULES}


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_what_the_emulated_world_cannot_play_is_refused(rule_id):
    with pytest.raises(ConfigValidationError) as info:
        emulated(**CASES[rule_id]).validate(world_size=4)
    assert rule_id in {v.rule for v in info.value.violations}


NVSHMEM = {"model.torch_native_dispatcher": "sorted", "model.torch_native_ep_transport": "nvshmem"}
GRAPHED = {
    **NVSHMEM,
    "dist.device": "cuda",
    "model.cuda_graph_impl": "full_iteration",
    "model.cuda_graph_warmup_steps": 1,
    "train.train_iters": 4,
}


@pytest.mark.parametrize("changes", [{}, NVSHMEM, GRAPHED], ids=["plain", "nvshmem", "nvshmem-cuda-graph"])
def test_an_emulated_layout_it_can_play_passes(changes):
    """The NVSHMEM exchange is played on the device (``emulated_exchange.py``), and a captured step's
    collectives are charged at each replay (``emulation/record.py``): neither is refused."""
    emulated(**changes).validate(world_size=4)


@pytest.mark.parametrize(
    "field, value",
    [
        ("emulation.world_size", 0),
        ("emulation.rank", -1),
        ("emulation.inter_node_gbps", 0.0),
        ("emulation.comm_sms", 2.5),
    ],
)
def test_emulation_figures_out_of_range_are_refused(field, value):
    with pytest.raises(ConfigValidationError) as info:
        emulated(**{field: value}).validate(world_size=4)
    assert f"range:{field}" in {v.rule for v in info.value.violations}


@pytest.mark.parametrize(
    "field, value",
    [("emulation.network", "free"), ("emulation.rank", 3), ("emulation.gpus_per_node", 4), ("emulation.comm_sms", 8)],
)
def test_an_emulation_setting_on_a_real_world_is_refused_naming_it(field, value):
    """Every accepted setting has its effect: a dotted ``emulation.*`` override without an emulated world
    (``--emulate``) would change nothing, so it is refused, as the harness refuses --network alone."""
    cfg = emulated(**{"emulation.world_size": None, field: value})
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate(world_size=4)
    (violation,) = [v for v in info.value.violations if v.rule == "emulation-settings-need-an-emulated-world"]
    assert f"{field}={value!r}" in violation.format() and "--emulate" in violation.fix


def test_a_real_world_with_the_emulation_defaults_passes():
    emulated(**{"emulation.world_size": None}).validate(world_size=4)
