"""A lower bound of what one micro-batch's forward keeps for its backward on one rank: the tensors every
transformer layer saves without recomputation, and the logits.

Read by the memory rules beside the model-state estimate (``memory_estimate.py``): a layout whose
weights, gradients and optimizer state fit can still run out of memory in its first step (the
48-layer EP=1 reference of Qwen3-30B-A3B's per-GPU work did, on an 80 GB H100). Per layer and token
(``h`` hidden, ``a`` attention heads, ``g`` query groups, ``d`` head size, ``k`` routed experts a
token, ``f`` an expert's FFN size, doubled for fc1 when gated):

* the input of each of the two norms and each norm's output (``4h``): the attention's and the
  MLP's input, the router's;
* the query, key and value (``(a + 2g)d``) and the attention's output, the projection's input (``ad``);
* an MoE layer's expert rows, ``k`` a token: fc1's input (``kh``), its output (``2kf`` gated) and the
  activation's output, fc2's input (``kf``); a dense layer the same for one row. Where the config asks
  for the EP > 1 sorted dispatcher, whose static buffers are sized before the routing, ``k`` is its
  rows a token (``sorted_dispatch.sorted_expert_rows``): the budget of
  ``model.torch_native_rank_capacity_factor`` (``factor x top-k``), else the worst case ``EP x
  min(top-k, local experts)``; they are allocated whatever the routing.

Every choice errs low: one micro-batch in flight (a pipeline's first stage holds more, the EP-overlap
schedule up to two), every tensor split over tensor and context parallelism, a routed expert's rows
at their balanced share, 1 byte an element under FP8 and 2 otherwise, tensors a recompute setting
names left out (an unknown module name, or ``full``, leaves only each layer's input), no layer's
when activations are offloaded; the bf16 logits always. Biases, norms' statistics, attention's
softmax statistics and the allocator's own overhead are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from megatron.bridge.models.dispatch.sorted_dispatch import sorted_expert_rows
from megatron.bridge.models.torch_native.expert_rows import factor_holds
from megatron.bridge.training.config_stages.facts.memory_estimate import (
    gib,
    layer_widths,
    moe_layer_count,
    positive,
)

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

KNOWN_RECOMPUTE_MODULES = frozenset({"core_attn", "layernorm", "moe_act", "moe", "mlp"})
"""``model.recompute_modules`` entries whose dropped tensors this estimate knows; any other name (and
``recompute_granularity=full``) leaves only each layer's input counted."""


@dataclass(frozen=True)
class ActivationEstimate:
    """Saved activations of one micro-batch on one rank."""

    tokens: int
    """Tokens of the micro-batch this rank holds (sequence x micro-batch, over tensor and context parallelism)."""
    layers: int
    elements_per_layer: tuple[int, int]
    """Elements one (dense, MoE) layer saves."""
    moe_layers: int
    bytes_per_element: int
    logits_bytes: int
    sorted_expert_rows: float | None = None
    """Expert rows a token of the sorted dispatcher's static buffers (``None``: top-k, balanced)."""
    sorted_rows_budgeted: bool = False
    """Whether those rows are ``torch_native_rank_capacity_factor``'s budget (else the worst case)."""

    @property
    def layer_bytes(self) -> int:
        dense, moe = self.elements_per_layer
        return ((self.layers - self.moe_layers) * dense + self.moe_layers * moe) * self.bytes_per_element

    @property
    def total_bytes(self) -> int:
        return self.layer_bytes + self.logits_bytes

    def describe(self) -> str:
        """``at least 20.3 GiB: 48 layers x 4,096 tokens (19.1 GiB), logits 1.2 GiB``"""
        which = "budget" if self.sorted_rows_budgeted else "worst case"
        worst = (
            f", expert rows at the sorted dispatcher's {which} ({self.sorted_expert_rows:g} a token)"
            if self.sorted_expert_rows
            else ""
        )
        return (
            f"at least {gib(self.total_bytes)}: {self.layers} layers x {self.tokens:,} tokens "
            f"({gib(self.layer_bytes)}{worst}), logits {gib(self.logits_bytes)}"
        )


def _recompute(cfg: ConfigContainer) -> frozenset[str] | None:
    """The modules whose saved tensors are recomputed, or ``None`` when only layer inputs are surely kept."""
    m = cfg.model
    if m.recompute_granularity == "full":
        return None
    modules = frozenset(m.recompute_modules or ()) if m.recompute_granularity == "selective" else frozenset()
    return modules if modules <= KNOWN_RECOMPUTE_MODULES else None


def _mlp_elements(hidden: int, ffn: int, rows: float, gated: bool, dropped: frozenset[str], module: str) -> float:
    """Elements an MLP of ``rows`` rows a token saves: fc1's input and output, the activation's output
    (none of them when ``module`` is recomputed, not the last under ``moe_act``)."""
    if module in dropped:
        return 0
    activation = 0 if module == "moe" and "moe_act" in dropped else ffn
    return rows * (hidden + (2 if gated else 1) * ffn + activation)


def _per_token(cfg: ConfigContainer) -> tuple[int, float, float | None]:
    """Elements a (dense, MoE) layer saves per token held, and the sorted dispatcher's static expert
    rows a token where they are among them (``None`` elsewhere)."""
    m = cfg.model
    if getattr(m, "cpu_offloading", False) or getattr(m, "fine_grained_activation_offloading", False):
        return 0, 0, None
    hidden, dropped = m.hidden_size, _recompute(cfg)
    if dropped is None:
        return hidden, hidden, None
    heads = m.num_attention_heads
    groups, head_size, ffn = layer_widths(cfg)
    attention = (2 if "layernorm" in dropped else 4) * hidden + (2 * heads + 2 * groups) * head_size
    gated = m.gated_linear_unit
    dense = attention + _mlp_elements(hidden, ffn, 1, gated, dropped, "mlp")
    worst = None if "moe" in dropped else sorted_expert_rows(m)
    rows = worst or m.moe_router_topk or 1
    moe = attention + _mlp_elements(hidden, m.moe_ffn_hidden_size or ffn, rows, gated, dropped, "moe")
    return dense, moe, worst


def activation_estimate(cfg: ConfigContainer) -> ActivationEstimate:
    """The lower bound of the module docstring; call it only where the memory estimate is estimable."""
    m = cfg.model
    held = positive(m.seq_length) * positive(cfg.train.micro_batch_size)  # unset or invalid: its rule speaks
    tokens = held // (m.tensor_model_parallel_size * m.context_parallel_size)
    layers = m.num_layers // m.pipeline_model_parallel_size
    dense, moe, worst = _per_token(cfg)
    moe_layers = min(layers, moe_layer_count(cfg, mlp_cheaper=dense <= moe) // m.pipeline_model_parallel_size)
    element = 1 if m.fp8 else 2
    logits = tokens * positive(m.vocab_size) * 2  # bf16, alive into the loss's backward whatever is offloaded
    worst = worst if moe_layers else None
    factor = m.torch_native_rank_capacity_factor
    budgeted = worst is not None and factor is not None and factor_holds(factor)
    elements = (dense * tokens, int(moe * tokens))  # a fractional budget's rows, rounded down: erring low
    return ActivationEstimate(tokens, layers, elements, moe_layers, element, logits, worst, budgeted)
