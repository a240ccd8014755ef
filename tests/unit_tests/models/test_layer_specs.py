"""``model.layer_spec=auto``: which layers a run builds, decided once from the run's facts, and why."""

from __future__ import annotations

import pytest
from packaging.version import Version

from megatron.bridge.models.layer_specs import choose_layer_spec, te_only_features
from megatron.bridge.recipes.qwen import qwen3_30b_a3b_pretrain_config, qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.config_stages.resolution.finalize import default_rule_context, resolve_config

TE = dict(te_available=True)
NO_TE = dict(te_available=False)

# requested, device, te facts, features needing TE -> (layers, words of the reason)
CHOICES = {
    "cpu run with TE importable": ("auto", "cpu", TE, [], ("torch_native", "a CPU run")),
    "cpu run asking for fp8": ("auto", "cpu", TE, ["FP8 compute"], ("torch_native", "a CPU run")),
    "gpu without TE": ("auto", "cuda", NO_TE, [], ("torch_native", "Transformer Engine absent")),
    "gpu, TE, bf16": ("auto", "cuda", TE, [], ("torch_native", "layer_specs.md")),
    "gpu, TE, fp8": ("auto", "cuda", TE, ["FP8 compute (model.fp8='hybrid')"], ("transformer_engine", "FP8")),
    "explicit TE": ("transformer_engine", "cuda", TE, [], ("transformer_engine", "requested")),
    "explicit local on cpu": ("local", "cpu", TE, [], ("local", "requested")),
}


@pytest.mark.parametrize("case", sorted(CHOICES))
def test_choice_and_reason(case):
    requested, device, te, features, (name, words) = CHOICES[case]
    choice = choose_layer_spec(requested, device=device, te_features=features, **te)
    assert choice.name == name and words in choice.reason


@pytest.mark.parametrize(
    "fields, words",
    [
        ({}, []),
        ({"fp8": "hybrid"}, ["FP8"]),
        ({"cuda_graph_impl": "transformer_engine"}, ["per-layer CUDA graphs"]),
    ],
)
def test_features_only_te_layers_provide(fields, words):
    model = qwen3_30b_a3b_pretrain_config().model
    for name, value in fields.items():
        setattr(model, name, value)
    found = te_only_features(model, tp_comm_overlap=False)
    assert len(found) == len(words) and all(w in f for w, f in zip(words, found))
    assert any("tensor-parallel" in f for f in te_only_features(model, tp_comm_overlap=True))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_run_with_te_importable_trains_torch_native_layers_and_the_finalized_config_holds_them(device):
    """The resolution decides ``auto`` once; what trains is the finalized copy, whose layer_spec
    holds the choice, while the user's config (and its YAML) keeps ``auto``."""
    # CPU smoke mode runs every rank on this host: the tiny recipe fits it, the 30B model does not
    cfg = qwen3_moe_tiny_pretrain_config() if device == "cpu" else qwen3_30b_a3b_pretrain_config()
    cfg.dist.device = device
    world = 2 if device == "cpu" else 16
    resolution = resolve_config(cfg, ctx=default_rule_context(world_size=world, te_version=Version("2.20.2")))
    assert resolution.layer_spec.name == "torch_native"
    assert resolution.config.model.layer_spec == "torch_native"
    assert resolution.config.model.transformer_impl == "local"
    assert cfg.model.layer_spec == resolution.effective.model.layer_spec == "auto"
    assert resolution.report.layer_spec == "torch_native"
