"""Flex token-dispatcher backends (DeepEP, HybridEP, NCCL EP): the rules of a choice and of its settings.

:data:`FLEX_RULES` (in the registry through the overlap rules): the choice against a ``RuleContext``'s target GPU
(as ``apply_``/``validate_flex_dispatcher_backend`` check it), read from the support table
(``flex_gpu_support.py``, re-exported here), and the packages the backends need on the GPU machines;
:data:`FLEX_SETTING_RULES`: the settings every backend reads (SM counts, the per-rank capacity) and what the
dispatcher megatron-core builds needs (MoE layers, TP x EP > 1), then each backend's own rules (its module in
``models/dispatch/``), seen whole only by ``cfg.validate()``. :func:`dispatcher_fields`: what choosing a
dispatcher sets.
"""

from __future__ import annotations

from typing import Any

from megatron.bridge.models.dispatch.dispatch_path import PLAIN_ALLTOALL_TEXT
from megatron.bridge.models.dispatch.flex_common import (
    CAPACITY_FIELD,
    NUM_SMS_FIELDS,
    effective_num_sms,
    flex_backend,
    on_backends,
    sm_counts,
)
from megatron.bridge.models.dispatch.path_registry import FLEX_BACKENDS, paths_of
from megatron.bridge.training.config_stages.facts.gpu_catalog import gpu_target_from_context
from megatron.bridge.training.config_stages.rules.dispatch_path_rules import FLEX_PACKAGE_RULES, FLEX_PATH_RULES
from megatron.bridge.training.config_stages.rules.flex_gpu_support import (
    FLEX_BACKEND_SUPPORT,
    BackendSupport,
    backend_support,
    flex_backend_support,
    render_support_table,
)
from megatron.bridge.training.config_stages.schema.rule_base import Rule, RuleContext


def dispatcher_fields(backend: str | None) -> dict[str, Any]:
    """Model fields of a dispatcher choice: a flex backend, or ``None`` for plain ``alltoall``.

    A flex backend also turns shared-expert overlap off, as the upstream selection does.
    """
    if backend is None:
        return {"moe_token_dispatcher_type": "alltoall", "moe_flex_dispatcher_backend": None}
    return {
        "moe_token_dispatcher_type": "flex",
        "moe_flex_dispatcher_backend": backend,
        "moe_shared_expert_overlap": False,
    }


def _flex(cfg: Any) -> bool:
    return cfg.model.moe_token_dispatcher_type == "flex"


def _has_moe_layers(cfg: Any) -> bool:
    """megatron-core builds a token dispatcher only for MoE layers (``num_moe_experts`` set and not 0)."""
    return bool(cfg.model.num_moe_experts)


def _backend_known(cfg: Any) -> bool:
    return _flex(cfg) and cfg.model.moe_flex_dispatcher_backend in flex_backend_support()


def _support(cfg: Any, ctx: RuleContext) -> tuple[bool | None, str]:
    return backend_support(cfg.model.moe_flex_dispatcher_backend, gpu_target_from_context(ctx))


def _gpu_text(ctx: RuleContext) -> str:
    return gpu_target_from_context(ctx).describe()


_PLAIN_ALLTOALL = PLAIN_ALLTOALL_TEXT
_SUPPORT_TEXT = "; ".join(
    f"{b.supported}{'' if b.nvl72 else ' (not GB200/GB300 NVL72)'}" for b in FLEX_BACKEND_SUPPORT.values()
)
_NVL72_BACKENDS = " or ".join(b.name for b in FLEX_BACKEND_SUPPORT.values() if b.nvl72)
_TP_X_EP = on_backends(("deepep", "ncclep"))
"""The backends that exchange within the TP x EP group (megatron-core asserts it is more than one GPU)."""
_WITH_RANK_CAPACITY = on_backends(p.name for p in paths_of("flex") if CAPACITY_FIELD in p.fields)
"""The backends whose own settings include the per-rank capacity (HybridEP, NCCL EP)."""

FLEX_RULES: tuple[Rule, ...] = (
    Rule(
        id="flex-backend-known",
        group="flex-dispatcher",
        fields=("model.moe_flex_dispatcher_backend",),
        applies=lambda cfg, ctx: cfg.model.moe_flex_dispatcher_backend is not None,
        holds=lambda cfg, ctx: cfg.model.moe_flex_dispatcher_backend in flex_backend_support(),
        message="unknown flex dispatcher backend (only backends with a GPU-support table are accepted)",
        fix=f"use one of {', '.join(FLEX_BACKENDS)}, or {_PLAIN_ALLTOALL}",
    ),
    Rule(
        id="flex-backend-needs-flex-dispatcher",
        group="flex-dispatcher",
        fields=("model.moe_flex_dispatcher_backend", "model.moe_token_dispatcher_type"),
        applies=lambda cfg, ctx: cfg.model.moe_flex_dispatcher_backend is not None,
        holds=lambda cfg, ctx: _flex(cfg),
        message="a flex backend does nothing while the dispatcher is not flex: megatron-core reads the "
        "backend only inside the flex dispatcher",
        fix="set model.moe_token_dispatcher_type=flex (or use --moe_flex_dispatcher_backend, which "
        "sets both), or model.moe_flex_dispatcher_backend=null for plain alltoall",
    ),
    Rule(
        id="flex-dispatcher-needs-backend",
        group="flex-dispatcher",
        fields=("model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend"),
        applies=lambda cfg, ctx: _flex(cfg),
        holds=lambda cfg, ctx: cfg.model.moe_flex_dispatcher_backend is not None,
        message="the flex dispatcher needs an explicit backend (no hidden megatron-core default)",
        fix=f"set model.moe_flex_dispatcher_backend to one of {', '.join(FLEX_BACKENDS)}",
    ),
    Rule(
        id="flex-backend-supported-on-gpu",
        group="flex-dispatcher",
        fields=("model.moe_flex_dispatcher_backend",),
        applies=lambda cfg, ctx: _backend_known(cfg),
        holds=lambda cfg, ctx: _support(cfg, ctx)[0] is not False,
        message=f"this flex backend does not support the target GPU: {_SUPPORT_TEXT}",
        fix=f"choose a backend that supports the target GPU ({_NVL72_BACKENDS} on GB200/GB300), or {_PLAIN_ALLTOALL}",
        extra_values=(("target_gpu", _gpu_text),),
        derived_values=(("support", lambda cfg, ctx: _support(cfg, ctx)[1]),),
    ),
    Rule(
        id="flex-backend-gpu-not-checked",
        group="flex-dispatcher",
        severity="warning",
        fields=("model.moe_flex_dispatcher_backend",),
        applies=lambda cfg, ctx: _backend_known(cfg),
        holds=lambda cfg, ctx: _support(cfg, ctx)[0] is not None,
        message="backend support on the target GPU could not be decided (no GPU type given and no "
        "visible GPU, or a Blackwell capability without the system name)",
        fix="pass the GPU type (-g h100/b200/gb200...) to validate against the cluster's GPUs",
        extra_values=(("target_gpu", _gpu_text),),
        derived_values=(("support", lambda cfg, ctx: _support(cfg, ctx)[1]),),
    ),
    *FLEX_PACKAGE_RULES,
)
"""Flex-dispatcher prerequisites of the choice itself, evaluated against the target GPU of a ``RuleContext``."""


def _whole_positive(value: Any) -> bool:
    """A whole number of at least 1 (``True`` is not a count)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _positive_number(value: Any) -> bool:
    """A real number above 0 (``True`` is not a factor)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _capacity(cfg: Any) -> Any:
    return cfg.model.moe_expert_rank_capacity_factor


FLEX_SETTING_RULES: tuple[Rule, ...] = (
    Rule(
        id="flex-num-sms-needs-flex-dispatcher",
        group="flex-settings",
        fields=NUM_SMS_FIELDS + ("model.moe_token_dispatcher_type",),
        applies=lambda cfg, ctx: bool(sm_counts(cfg.model)),
        holds=lambda cfg, ctx: _flex(cfg),
        message="the SM counts are read only by the flex dispatcher's backends (the DeepEP, HybridEP and "
        "NCCL EP kernels); with another dispatcher they would do nothing",
        fix="leave model.moe_flex_dispatcher_num_sms, moe_deepep_num_sms and moe_hybridep_num_sms null, or "
        f"select a flex backend (--moe_flex_dispatcher_backend {'|'.join(FLEX_BACKENDS)})",
    ),
    Rule(
        id="flex-num-sms-one-value",
        group="flex-settings",
        fields=NUM_SMS_FIELDS,
        applies=lambda cfg, ctx: len(sm_counts(cfg.model)) >= 2,
        holds=lambda cfg, ctx: len(set(map(repr, sm_counts(cfg.model).values()))) == 1,
        message="megatron-core keeps one SM count for every flex backend: it copies a deprecated "
        "moe_deepep_num_sms or moe_hybridep_num_sms into moe_flex_dispatcher_num_sms only while that is "
        "unset (and refuses two different deprecated values), so one of these values would be ignored",
        fix="set only model.moe_flex_dispatcher_num_sms and leave the deprecated names null",
    ),
    Rule(
        id="flex-num-sms-positive",
        group="flex-settings",
        fields=NUM_SMS_FIELDS,
        applies=lambda cfg, ctx: bool(sm_counts(cfg.model)),
        holds=lambda cfg, ctx: all(map(_whole_positive, sm_counts(cfg.model).values())),
        message="an SM count is a whole number of streaming multiprocessors, at least 1 (null lets the "
        "backend choose: DeepEP 20, HybridEP DeepEP's default, NCCL EP Transformer Engine's)",
        fix="set model.moe_flex_dispatcher_num_sms to a whole number >= 1 (e.g. 24), or null",
    ),
    Rule(
        id="flex-dispatcher-needs-moe-layers",
        group="flex-settings",
        fields=("model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend", "model.num_moe_experts"),
        applies=lambda cfg, ctx: _flex(cfg),
        holds=lambda cfg, ctx: _has_moe_layers(cfg),
        message="the model has no MoE layers (num_moe_experts unset or 0), so megatron-core never builds a "
        "token dispatcher: the flex dispatcher and its backend would do nothing (Megatron-Bridge's "
        "apply_flex_dispatcher_backend skips a dense model for the same reason)",
        fix=f"use {_PLAIN_ALLTOALL} and model.moe_token_dispatcher_type=alltoall for a dense model, or set "
        "model.num_moe_experts",
    ),
    Rule(
        id="flex-backend-needs-tp-x-ep",
        group="flex-settings",
        fields=(
            "model.moe_flex_dispatcher_backend",
            "model.tensor_model_parallel_size",
            "model.expert_model_parallel_size",
        ),
        applies=lambda cfg, ctx: _TP_X_EP(cfg, ctx) and _has_moe_layers(cfg),
        holds=lambda cfg, ctx: cfg.model.tensor_model_parallel_size * cfg.model.expert_model_parallel_size > 1,
        message="the DeepEP and NCCL EP dispatchers exchange tokens within the TP x EP group; megatron-core "
        "asserts TP x EP > 1 when it builds them for the MoE layers (Megatron-Bridge's validate() does not "
        "check it, so there the run stops at model build)",
        fix=f"set model.expert_model_parallel_size > 1 (-ep), or use {_PLAIN_ALLTOALL}",
    ),
    Rule(
        id="rank-capacity-factor-needs-hybridep-or-ncclep",
        group="flex-settings",
        fields=(
            "model.moe_expert_rank_capacity_factor",
            "model.moe_token_dispatcher_type",
            "model.moe_flex_dispatcher_backend",
        ),
        applies=lambda cfg, ctx: _capacity(cfg) is not None,
        holds=_WITH_RANK_CAPACITY,
        message="the per-rank token budget sizes HybridEP's and NCCL EP's receive buffers and nothing else: "
        "megatron-core refuses it with another flex backend and never reads it outside the flex dispatcher",
        fix="set model.moe_expert_rank_capacity_factor=null, or select hybridep or ncclep "
        "(--moe_flex_dispatcher_backend hybridep|ncclep)",
    ),
    Rule(
        id="rank-capacity-factor-positive",
        group="flex-settings",
        fields=("model.moe_expert_rank_capacity_factor",),
        applies=lambda cfg, ctx: _capacity(cfg) is not None,
        holds=lambda cfg, ctx: _positive_number(_capacity(cfg)),
        message="the per-rank token budget is the factor times the tokens x top-k a rank routes (1.0: a "
        "perfectly balanced routing just fits); it must be a number above 0",
        fix="set model.moe_expert_rank_capacity_factor to a number above 0 (e.g. 1.5), or null",
    ),
    *FLEX_PATH_RULES,
)
"""The flex backends' settings: what ``cfg.validate()`` checks beyond the choice of backend; the settings
every backend reads, then each backend's own rules (``models/dispatch/``)."""


__all__ = [
    "FLEX_BACKEND_SUPPORT",
    "FLEX_RULES",
    "FLEX_SETTING_RULES",
    "NUM_SMS_FIELDS",
    "BackendSupport",
    "backend_support",
    "dispatcher_fields",
    "effective_num_sms",
    "flex_backend",
    "flex_backend_support",
    "render_support_table",
    "sm_counts",
]
"""The support table's names (``flex_gpu_support.py``) are re-exported: the rules and their table are
imported from here."""
