"""Qwen3-MoE architecture (public model cards): RMSNorm, SwiGLU, no bias, QK-layernorm, RoPE 1e6."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from megatron.bridge.models.gpt_provider import CrossEntropyImpl, GPTModelProvider


@dataclass
class Qwen3MoEModelProvider(GPTModelProvider):
    """Architecture shared by all Qwen3-MoE sizes; sizes are set by the presets below."""

    normalization: str = "RMSNorm"
    activation_func: Callable[[torch.Tensor], torch.Tensor] = F.silu
    gated_linear_unit: bool = True
    add_bias_linear: bool = False
    add_qkv_bias: bool = False
    qk_layernorm: bool = True
    layernorm_epsilon: float = 1e-6
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    init_method_std: float = 0.02
    position_embedding_type: Literal["learned_absolute", "rope", "none"] = "rope"
    rotary_base: float = 1_000_000.0
    share_embeddings_and_output_weights: bool = False
    vocab_size: int | None = 151936
    seq_length: int = 4096
    kv_channels: int | None = 128
    # Mixture of experts: every layer is an MoE layer, top-k softmax router in fp32, aux loss 1e-3.
    num_moe_experts: int | None = 128
    moe_router_topk: int = 8
    moe_ffn_hidden_size: int | None = 768
    moe_layer_freq: int = 1
    moe_aux_loss_coeff: float = 1e-3
    moe_router_load_balancing_type: str = "aux_loss"
    moe_router_pre_softmax: bool = False
    moe_router_dtype: Literal["fp32", "fp64"] | None = "fp32"
    moe_grouped_gemm: bool = True
    moe_token_dispatcher_type: Literal["allgather", "alltoall", "flex"] = "alltoall"
    moe_permute_fusion: bool = False
    moe_shared_expert_overlap: bool = False
    bias_activation_fusion: bool = False
    bias_dropout_fusion: bool = False
    masked_softmax_fusion: bool = False
    persist_layer_norm: bool = False
    apply_rope_fusion: bool = False
    gradient_accumulation_fusion: bool = False
    cross_entropy_loss_fusion: bool = True
    cross_entropy_fusion_impl: CrossEntropyImpl = "torch_native"


@dataclass
class Qwen3MoEModelProvider30B_A3B(Qwen3MoEModelProvider):
    """Qwen3-30B-A3B: 48 layers, hidden 2048, 32/4 heads, 128 experts top-8, expert FFN 768."""

    num_layers: int = 48
    hidden_size: int = 2048
    num_attention_heads: int = 32
    num_query_groups: int | None = 4
    ffn_hidden_size: int | None = 6144
    moe_ffn_hidden_size: int | None = 768


@dataclass
class Qwen3MoEModelProvider235B_A22B(Qwen3MoEModelProvider):
    """Qwen3-235B-A22B: 94 layers, hidden 4096, 64/4 heads, 128 experts top-8, expert FFN 1536."""

    num_layers: int = 94
    hidden_size: int = 4096
    num_attention_heads: int = 64
    num_query_groups: int | None = 4
    ffn_hidden_size: int | None = 12288
    moe_ffn_hidden_size: int | None = 1536
