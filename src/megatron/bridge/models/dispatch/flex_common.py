"""What megatron-core's flex dispatcher backends (``deepep.py``, ``hybridep.py``, ``ncclep.py``) share:
how a config selects one, the SM count every backend reads, and the start-up line.

The flex dispatcher runs with ``moe_token_dispatcher_type=flex`` and a ``moe_flex_dispatcher_backend``;
a backend alone does nothing (its rule is ``flex-backend-needs-flex-dispatcher``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from megatron.bridge.utils.rule_records import RuleContext

NUM_SMS_FIELDS: tuple[str, ...] = (
    "model.moe_flex_dispatcher_num_sms",
    "model.moe_deepep_num_sms",
    "model.moe_hybridep_num_sms",
)
"""megatron-core 0.19.2's SM count of the flex dispatch kernels, and its two deprecated names."""
CAPACITY_FIELD = "model.moe_expert_rank_capacity_factor"
OP_FUSER_FIX = (
    "model.layer_spec=transformer_engine with Transformer Engine installed, "
    "model.use_transformer_engine_op_fuser=true and model.moe_grouped_gemm=true"
)
"""The fix of the rules that need Transformer Engine's fused grouped MLP (HybridEP's and NCCL EP's)."""


def flex_backend(cfg: Any) -> str | None:
    """The flex backend that runs: the backend when the dispatcher is ``flex``, else ``None``."""
    return cfg.model.moe_flex_dispatcher_backend if cfg.model.moe_token_dispatcher_type == "flex" else None


def on_backends(backends: Iterable[str]) -> Callable[[Any, RuleContext], bool]:
    """Rule predicate: the flex dispatcher runs one of ``backends``."""
    names = tuple(backends)
    return lambda cfg, ctx: flex_backend(cfg) in names


def sm_counts(model: Any) -> dict[str, Any]:
    """The SM-count fields of ``model`` that are set, by dotted name."""
    values = {f: getattr(model, f.removeprefix("model.")) for f in NUM_SMS_FIELDS}
    return {f: v for f, v in values.items() if v is not None}


def effective_num_sms(model: Any) -> Any:
    """The SM count megatron-core passes to the backend: ``moe_flex_dispatcher_num_sms``, else the
    deprecated name that is set (its ``__post_init__`` copies it over), else ``None`` (backend default)."""
    return next(iter(sm_counts(model).values()), None)


def capacity_text(model: Any) -> str:
    """The per-rank budget of HybridEP's and NCCL EP's receive buffers, for the start-up line."""
    factor = model.moe_expert_rank_capacity_factor
    return "no per-rank budget" if factor is None else f"per-rank capacity factor {factor}"


def describe_flex(model: Any, settings: Iterable[str] = ()) -> str:
    """``flex, backend ncclep (static shape, zero copy off, per-rank capacity factor 1.5, SMs: backend
    default)``: the backend, its own ``settings``, and the SM count every backend reads."""
    sms = effective_num_sms(model)
    parts = [*settings, f"SMs: {'backend default' if sms is None else sms}"]
    return f"flex, backend {model.moe_flex_dispatcher_backend} ({', '.join(parts)})"
