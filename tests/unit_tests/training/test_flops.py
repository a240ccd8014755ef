"""MoE-aware model FLOPs: each component against a hand count, and the structural properties."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from megatron.bridge.recipes.qwen import qwen3_30b_a3b_pretrain_config, qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.telemetry.flops import flops_per_step, flops_per_token, moe_layer_pattern
from megatron.bridge.training.telemetry.metrics import throughput


def toy(**kw) -> SimpleNamespace:
    base = dict(
        hidden_size=8,
        seq_length=16,
        num_attention_heads=2,
        num_query_groups=1,
        kv_channels=4,
        gated_linear_unit=True,
        num_layers=2,
        num_moe_experts=4,
        moe_layer_freq=1,
        moe_router_topk=2,
        moe_ffn_hidden_size=6,
        ffn_hidden_size=10,
        moe_shared_expert_intermediate_size=None,
        vocab_size=32,
    )
    base.update(kw)
    return SimpleNamespace(**base)


def test_components_by_hand() -> None:
    f = flops_per_token(toy())
    # per layer: Q 2*8*8 + KV 2*2*8*4 + O 2*8*8 = 128 + 128 + 128 = 384; 2 layers
    assert f.attention_projections == 2 * 384
    # causal core 2*s*a*d = 2*16*2*4 = 256 per layer
    assert f.attention_core == 2 * 256
    assert f.router == 2 * (2 * 8 * 4)
    # top-2 SwiGLU experts: 2 * 3 * 2*8*6 = 576 per layer
    assert f.routed_experts == 2 * 576
    assert f.shared_experts == 0 and f.dense_mlp == 0
    assert f.logits == 2 * 8 * 32
    assert f.forward_backward == 3 * f.forward


@pytest.mark.parametrize(
    "change,component,factor",
    [
        (dict(moe_router_topk=4), "routed_experts", 2.0),  # only the visited experts count
        (dict(num_moe_experts=8), "routed_experts", 1.0),  # more experts, same active compute
        (dict(num_moe_experts=8), "router", 2.0),
        (dict(seq_length=32), "attention_core", 2.0),
        (dict(gated_linear_unit=False), "routed_experts", 2 / 3),
        (dict(num_query_groups=2), "attention_projections", 512 / 384),  # MHA vs GQA
    ],
)
def test_scaling(change: dict, component: str, factor: float) -> None:
    before = getattr(flops_per_token(toy()), component)
    after = getattr(flops_per_token(toy(**change)), component)
    assert after == pytest.approx(before * factor)


def test_not_causal_doubles_the_core() -> None:
    assert flops_per_token(toy(), causal=False).attention_core == 2 * flops_per_token(toy()).attention_core


def test_shared_experts_and_dense_layers() -> None:
    f = flops_per_token(toy(moe_shared_expert_intermediate_size=12, moe_layer_freq=[1, 0]))
    assert f.shared_experts == 1 * 3 * 2 * 8 * 12
    assert f.dense_mlp == 1 * 3 * 2 * 8 * 10
    assert f.routed_experts == 1 * 2 * 3 * 2 * 8 * 6


@pytest.mark.parametrize(
    "layers,experts,freq,expected",
    [
        (4, 8, 1, [True] * 4),
        (4, 8, 2, [True, False, True, False]),
        (3, 8, [0, 1, 1], [False, True, True]),
        (2, None, 1, [False, False]),
    ],
)
def test_moe_layer_pattern(layers, experts, freq, expected) -> None:
    assert moe_layer_pattern(layers, experts, freq) == expected


def test_moe_layer_pattern_rejects_wrong_length() -> None:
    with pytest.raises(ValueError, match="entries"):
        moe_layer_pattern(3, 8, [1, 0])


def test_step_is_tokens_times_per_token() -> None:
    m = toy()
    assert flops_per_step(m, global_batch_size=4) == flops_per_token(m).forward_backward * 4 * 16


def test_qwen3_30b_a3b_active_parameters_ballpark() -> None:
    """~3.3B active parameters (of which ~0.6B embeddings/logits): matmul FLOPs ~ 2 x active params."""
    model = qwen3_30b_a3b_pretrain_config().model
    f = flops_per_token(model, seq_length=1)  # attention core ~0 at s=1
    active_non_embedding = (f.forward - f.logits) / 2
    assert 2.4e9 < active_non_embedding < 3.2e9


def test_tiny_recipe_has_positive_flops() -> None:
    assert flops_per_step(qwen3_moe_tiny_pretrain_config().model, 8) > 0


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("window_size", (128, 0), "sliding attention window"),
        ("multi_latent_attention", True, "multi-latent attention"),
        ("attention_output_gate", True, "gated attention output"),
        ("experimental_attention_variant", "gated_delta_net", "experimental attention variant"),
    ],
    ids=["window", "mla", "output-gate", "experimental"],
)
def test_an_attention_the_formula_does_not_count_gives_no_figure(field, value, named, caplog):
    """Never a silently wrong MFU: an attention outside the formula is not counted, and the run says so."""
    model = qwen3_30b_a3b_pretrain_config().model
    setattr(model, field, value)
    assert flops_per_step(model, 8) is None
    assert named in caplog.text and "n/a" in caplog.text
    assert throughput(1.0, 100, None, 8)["tflops_per_gpu"] is None


def test_the_qwen3_attention_is_counted():
    assert flops_per_step(qwen3_30b_a3b_pretrain_config().model, 8) > 0
