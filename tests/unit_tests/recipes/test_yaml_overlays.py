"""The YAML overlays shipped in recipes/ load, apply and validate on the recipes they target."""

from pathlib import Path

import pytest

from megatron.bridge.recipes.qwen import qwen3_30b_a3b_pretrain_config, qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

OVERLAYS = Path(__file__).resolve().parents[3] / "recipes"


@pytest.mark.parametrize(
    "overlay, recipe, world_size, expect",
    [
        (
            "ep_overlap.yaml",
            qwen3_30b_a3b_pretrain_config,
            16,
            {"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": False},
        ),
        (
            "ep_overlap_delay_wgrad.yaml",
            qwen3_30b_a3b_pretrain_config,
            16,
            {"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True},
        ),
        ("tiny_cpu_smoke.yaml", qwen3_moe_tiny_pretrain_config, 2, {"overlap_moe_expert_parallel_comm": True}),
    ],
)
def test_overlay_applies_and_validates(overlay, recipe, world_size, expect):
    cfg = process_config_with_overrides(recipe(), config_filepath=OVERLAYS / overlay)
    resolved = cfg.validate(world_size=world_size)
    for name, value in expect.items():
        assert getattr(resolved.model, name) is value
    assert all(source == "yaml" for source in cfg.provenance.values())


def test_every_overlay_is_tested():
    tested = {"ep_overlap.yaml", "ep_overlap_delay_wgrad.yaml", "tiny_cpu_smoke.yaml"}
    assert {p.name for p in OVERLAYS.glob("*.yaml")} == tested
