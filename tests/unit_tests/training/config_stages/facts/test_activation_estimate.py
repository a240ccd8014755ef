"""The saved-activation lower bound, by hand arithmetic on Qwen3-30B-A3B's layer (hidden 2048, 32 heads
of 128, 4 query groups, 8 experts a token of FFN 768, gated; 48 layers, seq 4096, vocab 151,936)."""

from __future__ import annotations

import io

import pytest

from megatron.bridge.perf.harness.run import main
from megatron.bridge.recipes.qwen import qwen3_30b_a3b_pretrain_config
from megatron.bridge.training.config_stages.facts.activation_estimate import activation_estimate
from megatron.bridge.training.config_stages.resolution.finalize import resolve_config

H, HEADS_D, GROUPS_D, K, F = 2048, 32 * 128, 4 * 128, 8, 768
NORMS = 4 * H  # two norms' inputs and outputs
ATTENTION = (HEADS_D + 2 * GROUPS_D) + HEADS_D  # q, k, v; the attention's output
EXPERTS = K * H + K * 2 * F + K * F  # fc1's input, fc1's output (gated), the activation's output
MOE_LAYER = NORMS + ATTENTION + EXPERTS  # 52,224 elements a token


def _estimate(world: int = 16, precision: str | None = None, **model):
    cfg = qwen3_30b_a3b_pretrain_config()
    if precision:
        cfg.mixed_precision = precision
    for name, value in model.items():
        setattr(cfg.model, name, value)
    return activation_estimate(resolve_config(cfg, world_size=world).effective)


def test_a_moe_layer_keeps_its_norms_attention_and_expert_rows():
    estimate = _estimate()
    assert MOE_LAYER == 52_224
    assert (estimate.tokens, estimate.layers, estimate.moe_layers) == (4096, 48, 48)
    assert estimate.elements_per_layer[1] == MOE_LAYER * 4096
    assert estimate.layer_bytes == 48 * MOE_LAYER * 4096 * 2
    assert estimate.logits_bytes == 4096 * 151_936 * 2
    assert estimate.describe().startswith("at least 20.3 GiB: 48 layers x 4,096 tokens (19.1 GiB)")


@pytest.mark.parametrize(
    "settings, per_token",
    [
        ({"recompute_granularity": "full"}, H),
        ({"recompute_granularity": "selective", "recompute_modules": ["core_attn"]}, MOE_LAYER),
        ({"recompute_granularity": "selective", "recompute_modules": ["layernorm"]}, MOE_LAYER - 2 * H),
        ({"recompute_granularity": "selective", "recompute_modules": ["moe_act"]}, MOE_LAYER - K * F),
        ({"recompute_granularity": "selective", "recompute_modules": ["moe"]}, MOE_LAYER - EXPERTS),
        ({"recompute_granularity": "selective", "recompute_modules": ["mla_up_proj"]}, H),  # unknown here: inputs
        ({"cpu_offloading": True, "cpu_offloading_num_layers": 1}, 0),
    ],
    ids=["full", "core-attn", "layernorm", "moe-act", "moe", "unknown-module", "offloaded"],
)
def test_recomputed_or_offloaded_tensors_are_left_out(settings, per_token):
    assert _estimate(**settings).elements_per_layer[1] == per_token * 4096


@pytest.mark.parametrize(
    "settings, tokens, layers, element",
    [
        ({"tensor_model_parallel_size": 2, "sequence_parallel": True}, 2048, 48, 2),
        ({"context_parallel_size": 2}, 2048, 48, 2),
        ({"pipeline_model_parallel_size": 2}, 4096, 24, 2),
        ({"precision": "bf16_with_fp8_current_scaling_mixed"}, 4096, 48, 1),
    ],
    ids=["tp2", "cp2", "pp2", "fp8"],
)
def test_a_rank_holds_its_share_of_tokens_and_layers(settings, tokens, layers, element):
    estimate = _estimate(world=64, **settings)
    assert (estimate.tokens, estimate.layers, estimate.bytes_per_element) == (tokens, layers, element)


@pytest.mark.parametrize("field", ["vocab_size", "seq_length"])
def test_an_unset_size_counts_nothing_its_own_rule_refuses_it(field):
    """Validation runs every rule at once: an unset size must not crash this one (a traceback)."""
    cfg = qwen3_30b_a3b_pretrain_config()
    setattr(cfg.model, field, None)
    estimate = activation_estimate(cfg)
    assert estimate.logits_bytes == 0 and (field == "vocab_size") == (estimate.layer_bytes > 0)


SORTED_EP16_ROWS = 16 * min(K, 128 // 16)  # every source's tokens once per local expert they may reach
"""The EP > 1 sorted dispatcher's worst-case buffer rows a token at EP=16 with 8 experts a GPU."""


SORTED = {"torch_native_dispatcher": "sorted", "expert_model_parallel_size": 16}


@pytest.mark.parametrize(
    "settings, rows, which",
    [
        (SORTED, SORTED_EP16_ROWS, "worst case"),
        ({**SORTED, "expert_model_parallel_size": 64}, 64 * 2, "worst case"),  # 2 local experts
        ({**SORTED, "torch_native_rank_capacity_factor": 2.0}, 2 * K, "budget"),  # the budget: 2 x top-k
        ({**SORTED, "torch_native_rank_capacity_factor": 1.25}, 1.25 * K, "budget"),
        ({**SORTED, "torch_native_rank_capacity_factor": 64.0}, SORTED_EP16_ROWS, "budget"),  # never past the worst
        ({**SORTED, "torch_native_rank_capacity_factor": 0.5}, SORTED_EP16_ROWS, "worst case"),  # refused by its rule
        ({"torch_native_dispatcher": "megatron", "expert_model_parallel_size": 16}, None, None),  # rows as routed
        ({"torch_native_dispatcher": "sorted", "expert_model_parallel_size": 1}, None, None),  # EP=1: exact sizes
        ({"torch_native_dispatcher": "auto", "expert_model_parallel_size": 16}, None, None),  # auto keeps megatron's
    ],
    ids=[
        "sorted-ep16",
        "sorted-ep64",
        "budget-2",
        "budget-1.25",
        "budget-past-worst",
        "bad-factor",
        "megatron",
        "sorted-ep1",
        "auto",
    ],
)
def test_the_sorted_dispatchers_static_buffers_are_counted_where_the_config_runs_it(settings, rows, which):
    estimate = _estimate(world=64, **settings)
    per_token = NORMS + ATTENTION + (rows or K) * (H + 2 * F + F)
    assert estimate.sorted_expert_rows == rows
    assert estimate.elements_per_layer[1] == int(per_token * 4096)
    text = f"expert rows at the sorted dispatcher's {which} ({rows:g} a token)" if rows else "sorted dispatcher"
    assert (text in estimate.describe()) == (rows is not None)


def test_a_budget_of_two_lets_the_seed_shape_on_the_sorted_dispatcher_pass_the_memory_rule(tmp_path):
    """The same layout as below with model.torch_native_rank_capacity_factor=2: 16 expert rows a token
    instead of 128, so the expected peak fits an H100 and the dry run goes on."""
    out = io.StringIO()
    argv = ["-mr", "qwen3_30b_a3b", "-g", "h100", "-ng", "16", "-ep", "16", "--max_steps", "3"]
    overrides = ["model.torch_native_dispatcher=sorted", "model.torch_native_rank_capacity_factor=2"]
    code = main([*argv, *overrides, "--dryrun", "-l", str(tmp_path / "run")], out=out)
    text = out.getvalue()
    assert "[model-and-activations-fit-gpu-memory]" not in text, text[-3000:]
    assert code == 0, text[-3000:]


def test_the_seed_shape_on_the_sorted_dispatcher_is_refused_before_launch_on_an_h100(tmp_path):
    """48 layers at EP=16 on the sorted dispatcher: its buffers alone (over 200 GiB of saved expert rows)
    cannot fit one H100, so the dry run stops it, where the run used to run out of memory."""
    out = io.StringIO()
    argv = ["-mr", "qwen3_30b_a3b", "-g", "h100", "-ng", "16", "-ep", "16", "--max_steps", "3"]
    code = main([*argv, "model.torch_native_dispatcher=sorted", "--dryrun", "-l", str(tmp_path / "run")], out=out)
    text = out.getvalue()
    assert code == 2 and "[model-and-activations-fit-gpu-memory]" in text, text[-3000:]
    assert f"sorted dispatcher's worst case ({SORTED_EP16_ROWS} a token)" in text
