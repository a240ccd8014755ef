"""Recipes build fresh, truthful, valid configs with the published model shapes and layouts."""

import pytest

from megatron.bridge.recipes.qwen import (
    qwen3_30b_a3b_pretrain_8gpu_config,
    qwen3_30b_a3b_pretrain_config,
    qwen3_235b_a22b_pretrain_config,
    qwen3_moe_tiny_pretrain_config,
)
from megatron.bridge.training.comm_overlap import CommOverlapConfig
from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.errors import ConfigValidationError
from megatron.bridge.training.utils.omegaconf_utils import apply_overrides

ALL_RECIPES = [
    qwen3_30b_a3b_pretrain_config,
    qwen3_30b_a3b_pretrain_8gpu_config,
    qwen3_235b_a22b_pretrain_config,
    qwen3_moe_tiny_pretrain_config,
]

# The Qwen3 model cards' shapes.
SHAPES = {
    "30b": dict(
        num_layers=48,
        hidden_size=2048,
        num_attention_heads=32,
        num_query_groups=4,
        kv_channels=128,
        ffn_hidden_size=6144,
        moe_ffn_hidden_size=768,
        num_moe_experts=128,
        moe_router_topk=8,
        vocab_size=151936,
    ),
    "235b": dict(
        num_layers=94,
        hidden_size=4096,
        num_attention_heads=64,
        num_query_groups=4,
        kv_channels=128,
        ffn_hidden_size=12288,
        moe_ffn_hidden_size=1536,
        num_moe_experts=128,
        moe_router_topk=8,
        vocab_size=151936,
    ),
    "tiny": dict(num_layers=2, hidden_size=128, num_moe_experts=8, moe_router_topk=2, vocab_size=1024, seq_length=128),
}
COMMON_ARCH = dict(
    normalization="RMSNorm",
    gated_linear_unit=True,
    add_bias_linear=False,
    qk_layernorm=True,
    rotary_base=1_000_000.0,
    position_embedding_type="rope",
    share_embeddings_and_output_weights=False,
    moe_aux_loss_coeff=1e-3,
    moe_router_dtype="fp32",
)

# (recipe, shape key, TP, PP, CP, EP, GPUs of the reference layout, GBS, MBS, seq)
LAYOUTS = [
    (qwen3_30b_a3b_pretrain_config, "30b", 1, 1, 1, 16, 16, 1024, 1, 4096),
    (qwen3_30b_a3b_pretrain_8gpu_config, "30b", 4, 2, 1, 4, 8, 1024, 1, 4096),
    (qwen3_235b_a22b_pretrain_config, "235b", 4, 16, 2, 8, 256, 1024, 1, 4096),
    (qwen3_moe_tiny_pretrain_config, "tiny", 1, 1, 1, 1, 1, 8, 1, 128),
]


@pytest.mark.parametrize("recipe, shape, tp, pp, cp, ep, gpus, gbs, mbs, seq", LAYOUTS)
def test_recipe_shape_layout_and_validation(recipe, shape, tp, pp, cp, ep, gpus, gbs, mbs, seq):
    cfg = recipe()
    model = cfg.model
    for name, expected in {**SHAPES[shape], **COMMON_ARCH}.items():
        assert getattr(model, name) == expected, name
    assert (
        model.tensor_model_parallel_size,
        model.pipeline_model_parallel_size,
        model.context_parallel_size,
        model.expert_model_parallel_size,
    ) == (tp, pp, cp, ep)
    assert (cfg.train.global_batch_size, cfg.train.micro_batch_size, model.seq_length) == (gbs, mbs, seq)
    resolved = cfg.validate(world_size=gpus)
    assert resolved.model.bf16 is True and resolved.optimizer.bf16 is True


@pytest.mark.parametrize("recipe", ALL_RECIPES)
def test_recipe_states_dispatcher_and_overlap_truthfully(recipe):
    cfg = recipe()
    assert isinstance(cfg.comm_overlap, CommOverlapConfig)
    assert cfg.comm_overlap.overlap_moe_expert_parallel_comm is None  # unset, as upstream: off unless requested
    assert cfg.model.moe_token_dispatcher_type == "alltoall"
    assert cfg.model.moe_flex_dispatcher_backend is None
    resolved = cfg.validate()
    assert resolved.model.moe_token_dispatcher_type == "alltoall"
    assert resolved.model.overlap_moe_expert_parallel_comm is False
    assert cfg.dataset.is_mock and cfg.tokenizer.tokenizer_type == "NullTokenizer"


@pytest.mark.parametrize("recipe", ALL_RECIPES)
def test_recipe_returns_a_fresh_config_each_call(recipe):
    first, second = recipe(), recipe()
    first.model.num_layers = 1
    first.comm_overlap.overlap_moe_expert_parallel_comm = True
    assert second.model.num_layers != 1
    assert second.comm_overlap.overlap_moe_expert_parallel_comm is None


def test_validate_keeps_the_users_settings_and_sees_later_edits():
    cfg = qwen3_30b_a3b_pretrain_config()
    resolved = cfg.validate()
    assert resolved is not cfg
    assert resolved.model.bf16 is True
    assert cfg.mixed_precision == "bf16_mixed" and cfg.comm_overlap.overlap_grad_reduce is None  # owners as set
    assert cfg.model.bf16 is True  # the copy shows what the run uses
    cfg.mixed_precision = "fp32"
    assert cfg.validate().model.bf16 is False and cfg.model.bf16 is False


def test_done_when_command_prints_128_on_cpu():
    cfg = qwen3_30b_a3b_pretrain_config()
    cfg.validate()
    assert cfg.model.num_moe_experts == 128


# ------------------------------------------------------------------ the dataset's sequence length
@pytest.mark.parametrize("recipe", ALL_RECIPES)
def test_recipe_gives_the_dataset_the_model_s_sequence_length(recipe):
    """As Megatron-Bridge's recipes set both; the model's is the owner."""
    cfg = recipe()
    assert cfg.dataset.seq_length == cfg.model.seq_length >= 1


@pytest.mark.parametrize(
    "change",
    [
        lambda cfg: setattr(cfg.model, "seq_length", 64),
        lambda cfg: apply_overrides(cfg, ["model.seq_length=64"]),
        # another dataset field overridden rebuilds the dataset section: its copy is still the model's
        lambda cfg: apply_overrides(cfg, ["dataset.num_workers=0", "model.seq_length=64"]),
        lambda cfg: apply_overrides(apply_overrides(cfg, ["dataset.num_workers=0"]), ["model.seq_length=64"]),
    ],
    ids=["python", "dotted-override", "with-a-dataset-override", "after-a-dataset-override"],
)
def test_a_new_model_sequence_length_carries_over_to_the_dataset(change):
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg = change(cfg) or cfg
    resolved = cfg.validate()
    assert (resolved.dataset.seq_length, resolved.model.seq_length) == (64, 64)
    assert cfg.dataset.seq_length == 64  # what the run uses, written back


def test_the_recipe_argument_sets_both_sequence_lengths():
    cfg = qwen3_moe_tiny_pretrain_config(seq_length=64)
    assert (cfg.model.seq_length, cfg.dataset.seq_length) == (64, 64)


def test_both_sequence_lengths_set_alike_are_accepted_and_apart_refused():
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.model.seq_length = cfg.dataset.seq_length = 256  # a Megatron-Bridge script sets both
    assert cfg.validate().dataset.seq_length == 256
    cfg.dataset.seq_length = 512
    with pytest.raises(ConfigValidationError, match="owned-field-set-directly") as info:
        cfg.validate()
    assert "dataset.seq_length=512" in str(info.value) and "model.seq_length=512" in str(info.value)


def test_a_saved_config_holds_the_model_s_sequence_length_once(tmp_path):
    cfg = qwen3_moe_tiny_pretrain_config(seq_length=64)
    cfg.to_yaml(tmp_path / "run.yaml")
    assert (tmp_path / "run.yaml").read_text().count("seq_length: 64") == 1  # the model's
    loaded = ConfigContainer.from_yaml(tmp_path / "run.yaml")
    assert loaded.validate().dataset.seq_length == 64


@pytest.mark.parametrize("recipe", ALL_RECIPES)
def test_recipe_leaves_the_overlap_switches_unset_as_megatron_bridge_does(recipe):
    """Unset means the framework decides: EP overlap and delayed weight gradients off unless asked for."""
    cfg = recipe()
    assert (cfg.comm_overlap.overlap_moe_expert_parallel_comm, cfg.comm_overlap.delay_wgrad_compute) == (None, None)
    resolved = cfg.validate()
    assert (resolved.model.overlap_moe_expert_parallel_comm, resolved.model.delay_wgrad_compute) == (False, False)
