"""Core attention through ``torch.nn.functional.scaled_dot_product_attention``.

Drop-in for megatron-core's ``DotProductAttention`` slot (``SelfAttentionSubmodules.core_attention``):
same constructor and ``forward`` interface, ``[s, b, heads, dim]`` in, ``[s, b, heads * dim]`` out.
The projections, RoPE and QK-layernorm stay in megatron-core's ``SelfAttention``; only the
``softmax(QK^T) V`` core changes, so SDPA can pick a flash / cuDNN / memory-efficient kernel on
GPUs and the plain math kernel on CPU.
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide

_CAUSAL_TYPES = (AttnMaskType.causal,)


def _sdpa_supports_enable_gqa() -> bool:
    """``enable_gqa`` exists from torch 2.5; older torch needs K/V expanded by hand."""
    try:
        return "enable_gqa" in inspect.signature(F.scaled_dot_product_attention).parameters
    except (TypeError, ValueError):  # builtins without a signature: probe by version
        major, minor = (int(p) for p in torch.__version__.split(".")[:2])
        return (major, minor) >= (2, 5)


_HAS_ENABLE_GQA = _sdpa_supports_enable_gqa()


def sdpa_core_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    causal: bool,
    scale: float,
    dropout_p: float = 0.0,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention core on megatron layouts.

    Args:
        query: ``[sq, b, nq, d]``; key/value: ``[sk, b, nkv, d]`` with ``nq % nkv == 0``.
        causal: lower-triangular masking (``attn_mask`` is then ignored, as TE does).
        scale: softmax scale applied to ``QK^T``.
        attn_mask: megatron convention, ``True`` = masked out, broadcastable to ``[b, nq, sq, sk]``.

    Returns:
        ``[sq, b, nq * dv]`` (``dv``: value head dim).
    """
    sq, b, nq, d = query.shape
    nkv = key.shape[2]
    # [s, b, h, d] -> [b, h, s, d] as strided views; SDPA kernels only need a unit last stride.
    q = query.permute(1, 2, 0, 3)
    k = key.permute(1, 2, 0, 3)
    v = value.permute(1, 2, 0, 3)
    kwargs = {}
    if nq != nkv:
        if _HAS_ENABLE_GQA:
            kwargs["enable_gqa"] = True
        else:
            k = k.repeat_interleave(nq // nkv, dim=1)
            v = v.repeat_interleave(nq // nkv, dim=1)
    mask = None
    if not causal and attn_mask is not None:
        mask = ~attn_mask.to(torch.bool)  # SDPA: True = take part in attention
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal, scale=scale, **kwargs
    )
    # [b, h, s, dv] -> [s, b, h * dv] (dv may differ from the query/key dim, as in MLA)
    return out.permute(2, 0, 1, 3).reshape(sq, b, nq * value.shape[-1])


class TorchSDPAttention(MegatronModule):
    """``DotProductAttention`` replacement backed by ``scaled_dot_product_attention``.

    Supports what the Qwen3/GPT training path uses: causal or explicit masks, grouped-query
    heads, attention dropout (drawn from megatron's tensor-parallel RNG tracker like the
    original), query-key layer scaling (a no-op for the result). Packed sequences, sliding windows, attention bias,
    non-vanilla softmax and context parallelism raise, so a silent semantic change is impossible.
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: ProcessGroupCollection | None = None,
    ):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise NotImplementedError("torch_native attention does not support context parallelism")
        if getattr(config, "window_size", None) is not None:
            raise NotImplementedError("torch_native attention does not support sliding windows")
        if getattr(config, "softmax_type", "vanilla") != "vanilla":
            raise NotImplementedError("torch_native attention supports softmax_type='vanilla' only")
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        self.pg_collection = pg_collection
        self.tp_group = pg_collection.tp
        tp_size = pg_collection.tp.size()
        head_dim = divide(config.kv_channels * config.num_attention_heads, config.num_attention_heads)
        self.num_attention_heads_per_partition = divide(config.num_attention_heads, tp_size)
        self.num_query_groups_per_partition = divide(config.num_query_groups, tp_size)
        # apply_query_key_layer_scaling divides the scores by layer_number and multiplies them back
        # inside megatron's fp32 softmax (an fp16 overflow guard): the net scale is unchanged.
        self.softmax_scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        """``[s, b, h, d]`` query/key/value -> ``[s, b, h * d]`` context."""
        if packed_seq_params is not None:
            raise NotImplementedError("torch_native attention does not support packed sequences")
        if attention_bias is not None:
            raise NotImplementedError("torch_native attention does not support attention bias")
        mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        causal = mask_type in _CAUSAL_TYPES and query.shape[0] > 1
        if not causal and attention_mask is None and mask_type in _CAUSAL_TYPES:
            causal = False  # single-token query attends to everything before it
        dropout_p = self.dropout_p if self.training else 0.0
        run = lambda: sdpa_core_attention(  # noqa: E731 - one call, two RNG contexts
            query,
            key,
            value,
            causal=causal,
            scale=self.softmax_scale,
            dropout_p=dropout_p,
            attn_mask=attention_mask,
        )
        if dropout_p > 0.0 and not self.config.sequence_parallel:
            # Same RNG stream as megatron's DotProductAttention: dropout differs across TP ranks.
            with tensor_parallel.get_cuda_rng_tracker().fork():
                return run()
        return run()

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata=None):
        """No parameters (vanilla softmax), like ``DotProductAttention``."""
        return {}
