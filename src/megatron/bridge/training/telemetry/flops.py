"""MoE-aware model FLOPs (the "model FLOPs" of MFU: what the math needs, not what the kernels do).

Per token and per transformer layer, forward pass, counting a multiply-add as 2 FLOPs
(``h`` hidden, ``a``/``g`` query heads/KV groups, ``d`` head dim, ``s`` sequence length):

* attention projections: ``2*h*(a*d)`` (Q) + ``2*2*h*(g*d)`` (K, V; GQA) + ``2*(a*d)*h`` (output)
* attention core: ``QK^T`` and ``AV`` each ``2*s*a*d`` per token for a full mask; a causal mask
  halves them, so ``2*s*a*d`` in total (``4*s*a*d`` when not causal)
* MoE layer: router ``2*h*E``; routed experts only for the ``top_k`` experts a token visits:
  ``top_k * m*2*h*f_moe`` with ``m = 3`` for a gated (SwiGLU) MLP and ``2`` otherwise; shared
  experts, if any, ``m*2*h*f_shared``
* dense MLP layers (non-MoE layers of ``moe_layer_freq``): ``m*2*h*f``

plus, once per token, the output logits ``2*h*V`` (the embedding lookup costs no FLOPs).
Forward + backward is ``3x`` the forward (backward computes input and weight gradients).
Normalisations, activations, softmax and rotary embeddings are ignored (lower order).
Multi-token-prediction layers and recompute are not counted (recompute is not model FLOPs).

Attention this formula does not describe (a sliding window, multi-latent attention, an output gate,
linear or experimental attention variants, heterogeneous blocks) is not counted at all:
:func:`flops_per_step` returns ``None`` and says why, and the run reports model TFLOP/s as ``n/a``
rather than a figure that would be silently wrong.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

logger = logging.getLogger(__name__)

UNCOUNTED_ATTENTION = (
    ("window_size", "a sliding attention window"),
    ("multi_latent_attention", "multi-latent attention"),
    ("attention_output_gate", "a gated attention output"),
    ("experimental_attention_variant", "an experimental attention variant"),
    ("linear_attention_freq", "linear attention layers"),
    ("heterogeneous_block_specs", "heterogeneous transformer blocks"),
)
"""Model fields under which the attention FLOPs above do not hold, and what each names."""


@dataclass(frozen=True)
class FlopsPerToken:
    """Forward FLOPs per token, by component (summed over all layers)."""

    attention_projections: float
    attention_core: float
    router: float
    routed_experts: float
    shared_experts: float
    dense_mlp: float
    logits: float

    @property
    def forward(self) -> float:
        return sum(asdict(self).values())

    @property
    def forward_backward(self) -> float:
        return 3.0 * self.forward

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "forward": self.forward, "forward_backward": self.forward_backward}


def moe_layer_pattern(num_layers: int, num_experts: Any, moe_layer_freq: int | Sequence[int]) -> list[bool]:
    """Which layers are MoE layers (megatron's ``moe_layer_freq``: every k-th layer, or a 0/1 list)."""
    if not num_experts:
        return [False] * num_layers
    if isinstance(moe_layer_freq, int):
        return [i % moe_layer_freq == 0 for i in range(num_layers)]
    pattern = [bool(x) for x in moe_layer_freq]
    if len(pattern) != num_layers:
        raise ValueError(f"moe_layer_freq has {len(pattern)} entries for {num_layers} layers")
    return pattern


def flops_per_token(model: Any, seq_length: int | None = None, causal: bool = True) -> FlopsPerToken:
    """Forward FLOPs per token of a megatron ``TransformerConfig``-like model config."""
    h = model.hidden_size
    s = seq_length if seq_length is not None else model.seq_length
    a = model.num_attention_heads
    g = model.num_query_groups or a
    d = model.kv_channels or h // a
    mlp_mult = 3 if model.gated_linear_unit else 2
    layers = moe_layer_pattern(model.num_layers, model.num_moe_experts, model.moe_layer_freq)
    n_moe = sum(layers)
    n_dense = len(layers) - n_moe

    per_layer_proj = 2 * h * a * d + 2 * 2 * h * g * d + 2 * a * d * h
    per_layer_core = (2 if causal else 4) * s * a * d
    experts = model.num_moe_experts or 0
    topk = model.moe_router_topk if experts else 0
    f_moe = model.moe_ffn_hidden_size or model.ffn_hidden_size
    f_shared = getattr(model, "moe_shared_expert_intermediate_size", None) or 0
    vocab = model.padded_vocab_size() if hasattr(model, "padded_vocab_size") else model.vocab_size

    return FlopsPerToken(
        attention_projections=float(model.num_layers * per_layer_proj),
        attention_core=float(model.num_layers * per_layer_core),
        router=float(n_moe * 2 * h * experts),
        routed_experts=float(n_moe * topk * mlp_mult * 2 * h * f_moe) if experts else 0.0,
        shared_experts=float(n_moe * mlp_mult * 2 * h * f_shared),
        dense_mlp=float(n_dense * mlp_mult * 2 * h * model.ffn_hidden_size),
        logits=float(2 * h * vocab),
    )


def uncounted_attention(model: Any) -> str | None:
    """What in ``model``'s attention the formula does not count (``None``: everything is counted)."""
    found = [what for field, what in UNCOUNTED_ATTENTION if getattr(model, field, None)]
    return ", ".join(found) or None


def flops_per_step(model: Any, global_batch_size: int, seq_length: int | None = None) -> float | None:
    """Model FLOPs (forward + backward) of one optimizer step over the whole global batch; ``None``
    (said once in the log) for an attention the formula does not count."""
    why = uncounted_attention(model)
    if why is not None:
        logger.warning("model FLOPs are not counted for %s: TFLOP/s per GPU is reported as n/a", why)
        return None
    s = seq_length if seq_length is not None else model.seq_length
    return flops_per_token(model, s).forward_backward * global_batch_size * s
