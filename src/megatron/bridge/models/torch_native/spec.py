"""The torch-native layer spec: megatron-core's own GPT layer spec with a few slots swapped.

Built from megatron-core's local (non-TE) decoder block spec, so projections, RoPE, router, token dispatchers
(alltoall / flex / allgather), shared experts and the fine-grained EP-overlap schedule are megatron-core's. Only

* ``SelfAttentionSubmodules.core_attention``: ``DotProductAttention`` -> :class:`TorchSDPAttention`
* ``MoESubmodules.experts``: ``SequentialMLP`` -> :class:`TorchGroupedMLP`
* the MoE layer: ``MoELayer`` -> :class:`TorchNativeMoELayer` (same module; the dispatch path the
  registry picks replaces megatron's alltoall dispatcher, see ``moe_layer.py`` and ``models/dispatch/``)
* every ``WrappedTorchNorm`` slot (input, pre-MLP, query/key and final norms) ->
  :class:`TorchNativeNorm` (RMSNorm compiled on CUDA, see ``norm.py``; Apex norms stay)

change. Dense MLP layers (``moe_layer_freq`` patterns) keep megatron's ``MLP``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.transformer.moe.moe_layer import MoELayer
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron.bridge.models.torch_native.attention import TorchSDPAttention
from megatron.bridge.models.torch_native.experts import TorchGroupedMLP
from megatron.bridge.models.torch_native.moe_layer import TorchNativeMoELayer
from megatron.bridge.models.torch_native.norm import TorchNativeNorm


def _swap_norms(submodules: Any) -> Any:
    """Every field of a submodules dataclass that is megatron's ``WrappedTorchNorm``."""
    if not dataclasses.is_dataclass(submodules):
        return submodules
    swaps = {
        f.name: TorchNativeNorm
        for f in dataclasses.fields(submodules)
        if getattr(submodules, f.name) is WrappedTorchNorm
    }
    return dataclasses.replace(submodules, **swaps) if swaps else submodules


def _swap_attention(attn: Any) -> Any:
    if not isinstance(attn, ModuleSpec) or attn.submodules is None:
        return attn
    sub = attn.submodules
    sub = _swap_norms(sub)
    if getattr(sub, "core_attention", None) is DotProductAttention:
        sub = dataclasses.replace(sub, core_attention=TorchSDPAttention)
    return dataclasses.replace(attn, submodules=sub)


def _swap_experts(mlp: Any) -> Any:
    """``partial(MoELayer, submodules=MoESubmodules(experts=partial(SequentialMLP, ...)))`` ->
    ``partial(TorchNativeMoELayer, ... experts=partial(TorchGroupedMLP, ...))``."""
    if not (isinstance(mlp, functools.partial) and mlp.func is MoELayer):
        return mlp
    moe_sub = mlp.keywords.get("submodules")
    experts = getattr(moe_sub, "experts", None)
    if not (isinstance(experts, functools.partial) and experts.func is SequentialMLP):
        return mlp
    grouped = functools.partial(TorchGroupedMLP, **experts.keywords)
    keywords = dict(mlp.keywords, submodules=dataclasses.replace(moe_sub, experts=grouped))
    return functools.partial(TorchNativeMoELayer, *mlp.args, **keywords)


def torch_native_layer_spec(layer_spec: ModuleSpec) -> ModuleSpec:
    """One ``TransformerLayer`` spec with SDPA core attention, grouped-GEMM experts, fused norms."""
    sub = _swap_norms(layer_spec.submodules)
    new_sub = dataclasses.replace(sub, self_attention=_swap_attention(sub.self_attention), mlp=_swap_experts(sub.mlp))
    return dataclasses.replace(layer_spec, submodules=new_sub)


def get_torch_native_decoder_block_spec(
    config: TransformerConfig, vp_stage: int | None = None
) -> TransformerBlockSubmodules:
    """Decoder block spec of this pipeline stage for the torch-native implementation."""
    local = get_gpt_decoder_block_spec(config, use_transformer_engine=False, vp_stage=vp_stage)
    memo: dict[int, ModuleSpec] = {}  # layers share spec objects; keep the sharing
    layers = []
    for spec in local.layer_specs:
        if id(spec) not in memo:
            memo[id(spec)] = torch_native_layer_spec(spec)
        layers.append(memo[id(spec)])
    layer_norm = TorchNativeNorm if local.layer_norm is WrappedTorchNorm else local.layer_norm
    return dataclasses.replace(local, layer_specs=layers, layer_norm=layer_norm)
