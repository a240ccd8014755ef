"""Flex token-dispatcher backends (DeepEP, HybridEP, NCCL EP): the rules of a choice and of its settings.

:data:`FLEX_RULES` (in the registry through the overlap rules): the choice against a ``RuleContext``'s target GPU
(as ``apply_``/``validate_flex_dispatcher_backend`` check it), read from the support table
:data:`FLEX_BACKEND_SUPPORT` (``flex_gpu_support.py``, re-exported here); :data:`FLEX_SETTING_RULES`: the
backends' own settings (SM counts, per-rank capacity, NCCL EP's static shape and zero copy) and what the
dispatcher megatron-core builds needs (MoE layers, TP x EP > 1), seen whole only by ``cfg.validate()``.
:func:`dispatcher_fields`: what choosing a dispatcher sets; :func:`describe_dispatcher`: which dispatch path runs.
"""

from __future__ import annotations

from typing import Any, Optional

from megatron.bridge.training.config_stages.facts.gpu_catalog import gpu_target_from_context
from megatron.bridge.training.config_stages.facts.overlap_facts import (
    ep_on,
    layers_use_te,
    precision_fp4,
    precision_fp8,
)
from megatron.bridge.training.config_stages.rules.flex_gpu_support import (
    FLEX_BACKEND_SUPPORT,
    BackendSupport,
    backend_support,
    render_support_table,
)
from megatron.bridge.training.config_stages.schema.rule_base import TE_VERSION_VALUE, Rule, RuleContext
from megatron.bridge.utils.flex_backend_names import DEEP_EP_BACKENDS, FLEX_BACKENDS


def dispatcher_fields(backend: Optional[str]) -> dict[str, Any]:
    """Model fields of a dispatcher choice: a flex backend, or ``None`` for plain ``alltoall``.

    A flex backend also turns shared-expert overlap off, as the upstream selection does.
    """
    if backend is None:
        return {"moe_token_dispatcher_type": "alltoall", "moe_flex_dispatcher_backend": None}
    return {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": backend,
            "moe_shared_expert_overlap": False}


def _flex(cfg: Any) -> bool:
    return cfg.model.moe_token_dispatcher_type == "flex"


def _has_moe_layers(cfg: Any) -> bool:
    """megatron-core builds a token dispatcher only for MoE layers (``num_moe_experts`` set and not 0)."""
    return bool(cfg.model.num_moe_experts)


def _backend_known(cfg: Any) -> bool:
    return _flex(cfg) and cfg.model.moe_flex_dispatcher_backend in FLEX_BACKEND_SUPPORT


def flex_backend(cfg: Any) -> Optional[str]:
    """The flex backend that runs: the backend when the dispatcher is ``flex``, else ``None``."""
    return cfg.model.moe_flex_dispatcher_backend if _flex(cfg) else None


def _on(backends: tuple[str, ...]):
    """Predicate: the flex dispatcher runs one of ``backends``."""
    return lambda cfg, ctx: flex_backend(cfg) in backends


def _support(cfg: Any, ctx: RuleContext) -> tuple[Optional[bool], str]:
    return backend_support(cfg.model.moe_flex_dispatcher_backend, gpu_target_from_context(ctx))


def _gpu_text(ctx: RuleContext) -> str:
    return gpu_target_from_context(ctx).describe()


def _available_text(available: Optional[bool]) -> str:
    return {True: "importable", False: "not importable", None: "unknown"}[available]


def _host_text(ctx: RuleContext) -> str:
    return "GPU host" if ctx.cuda_available else "CPU host (dry run)"


_PLAIN_ALLTOALL = "plain alltoall (moe_flex_dispatcher_backend=null; harness: --moe_flex_dispatcher_backend None)"
_SUPPORT_TEXT = "; ".join(
    f"{b.supported}{'' if b.nvl72 else ' (not GB200/GB300 NVL72)'}" for b in FLEX_BACKEND_SUPPORT.values()
)
_NVL72_BACKENDS = " or ".join(b.name for b in FLEX_BACKEND_SUPPORT.values() if b.nvl72)
_DEEP_EP = _on(DEEP_EP_BACKENDS)
_NCCLEP = _on(("ncclep",))
_DEEP_EP_VALUES = (("deep_ep", lambda ctx: _available_text(ctx.deep_ep_available)), ("host", _host_text))
_TE_EP_VALUES = (("transformer_engine.pytorch.ep", lambda ctx: _available_text(ctx.te_nccl_ep_available)),
                 ("host", _host_text))
_TE_EP_INSTALL = ("install a Transformer Engine built with NCCL EP (NVTE_BUILD_WITH_NCCL_EP=1) on the GPU "
                  "machines")

FLEX_RULES: tuple[Rule, ...] = (
    Rule(
        id="flex-backend-known",
        group="flex-dispatcher",
        fields=("model.moe_flex_dispatcher_backend",),
        applies=lambda cfg, ctx: cfg.model.moe_flex_dispatcher_backend is not None,
        holds=lambda cfg, ctx: cfg.model.moe_flex_dispatcher_backend in FLEX_BACKEND_SUPPORT,
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
    Rule(
        id="flex-needs-deep-ep",
        group="flex-dispatcher",
        fields=("model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend"),
        applies=lambda cfg, ctx: _DEEP_EP(cfg, ctx) and bool(ctx.cuda_available),
        holds=lambda cfg, ctx: ctx.deep_ep_available is not False,
        message="the DeepEP and HybridEP backends need the deep_ep package, which does not import here",
        fix="install DeepEP on the GPU machines (see https://github.com/deepseek-ai/DeepEP, hybrid-ep "
        f"branch for hybridep), or use {_PLAIN_ALLTOALL}",
        extra_values=_DEEP_EP_VALUES,
    ),
    Rule(
        id="flex-deep-ep-not-checked-on-cpu-host",
        group="flex-dispatcher",
        severity="warning",
        fields=("model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend"),
        applies=lambda cfg, ctx: _DEEP_EP(cfg, ctx) and not ctx.cuda_available,
        holds=lambda cfg, ctx: ctx.deep_ep_available is not False,
        message="note: deep_ep does not import on this CPU host; the GPU machines must have it",
        fix="make sure DeepEP is installed where the job runs",
        extra_values=_DEEP_EP_VALUES,
    ),
    Rule(
        id="ncclep-needs-te-nccl-ep",
        group="flex-dispatcher",
        fields=("model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend"),
        applies=lambda cfg, ctx: _NCCLEP(cfg, ctx) and bool(ctx.cuda_available),
        holds=lambda cfg, ctx: ctx.te_nccl_ep_available is not False,
        message="the NCCL EP backend is NCCL's expert-parallel exchange called through Transformer Engine "
        "(transformer_engine.pytorch.ep), which does not import here; megatron-core would fail when it "
        "builds the MoE layers",
        fix=f"{_TE_EP_INSTALL}, or choose deepep/hybridep, or {_PLAIN_ALLTOALL}",
        extra_values=_TE_EP_VALUES,
    ),
    Rule(
        id="ncclep-te-nccl-ep-not-checked-on-cpu-host",
        group="flex-dispatcher",
        severity="warning",
        fields=("model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend"),
        applies=lambda cfg, ctx: _NCCLEP(cfg, ctx) and not ctx.cuda_available,
        holds=lambda cfg, ctx: ctx.te_nccl_ep_available is not False,
        message="note: Transformer Engine's NCCL EP module does not import on this CPU host; the GPU "
        "machines must have it",
        fix=f"{_TE_EP_INSTALL} where the job runs",
        extra_values=_TE_EP_VALUES,
    ),
)
"""Flex-dispatcher prerequisites of the choice itself, evaluated against the target GPU of a ``RuleContext``."""


def _whole_positive(value: Any) -> bool:
    """A whole number of at least 1 (``True`` is not a count)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _positive_number(value: Any) -> bool:
    """A real number above 0 (``True`` is not a factor)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


NUM_SMS_FIELDS: tuple[str, ...] = (
    "model.moe_flex_dispatcher_num_sms", "model.moe_deepep_num_sms", "model.moe_hybridep_num_sms",
)
"""megatron-core 0.19.2's SM count of the flex dispatch kernels, and its two deprecated names."""


def sm_counts(model: Any) -> dict[str, Any]:
    """The SM-count fields of ``model`` that are set, by dotted name."""
    values = {f: getattr(model, f.removeprefix("model.")) for f in NUM_SMS_FIELDS}
    return {f: v for f, v in values.items() if v is not None}


def effective_num_sms(model: Any) -> Any:
    """The SM count megatron-core passes to the backend: ``moe_flex_dispatcher_num_sms``, else the
    deprecated name that is set (its ``__post_init__`` copies it over), else ``None`` (backend default)."""
    return next(iter(sm_counts(model).values()), None)


def _capacity(cfg: Any) -> Any:
    return cfg.model.moe_expert_rank_capacity_factor


def _static_shape_low_precision(cfg: Any, ctx: RuleContext) -> bool:
    return bool(cfg.model.moe_ncclep_static_shape) and bool(precision_fp8(cfg) or precision_fp4(cfg))


def _capability_major(ctx: RuleContext) -> Optional[int]:
    target = gpu_target_from_context(ctx)
    return target.capability[0] if target.known else None


_OP_FUSER_FIX = ("model.layer_spec=transformer_engine with Transformer Engine installed, "
                 "model.use_transformer_engine_op_fuser=true and model.moe_grouped_gemm=true")

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
        id="deepep-num-sms-even",
        group="flex-settings",
        fields=NUM_SMS_FIELDS,
        applies=lambda cfg, ctx: flex_backend(cfg) == "deepep" and _whole_positive(effective_num_sms(cfg.model)),
        holds=lambda cfg, ctx: effective_num_sms(cfg.model) % 2 == 0,
        message="DeepEP runs its high-throughput kernels on pairs of SMs: deep_ep's Buffer.set_num_sms "
        "asserts an even count, when megatron-core builds the first MoE layer",
        fix="set model.moe_flex_dispatcher_num_sms to an even number (DeepEP's default is 20), or null",
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
        fields=("model.moe_flex_dispatcher_backend", "model.tensor_model_parallel_size",
                "model.expert_model_parallel_size"),
        applies=lambda cfg, ctx: _on(("deepep", "ncclep"))(cfg, ctx) and _has_moe_layers(cfg),
        holds=lambda cfg, ctx: cfg.model.tensor_model_parallel_size * cfg.model.expert_model_parallel_size > 1,
        message="the DeepEP and NCCL EP dispatchers exchange tokens within the TP x EP group; megatron-core "
        "asserts TP x EP > 1 when it builds them for the MoE layers (Megatron-Bridge's validate() does not "
        "check it, so there the run stops at model build)",
        fix=f"set model.expert_model_parallel_size > 1 (-ep), or use {_PLAIN_ALLTOALL}",
    ),
    Rule(
        id="rank-capacity-factor-needs-hybridep-or-ncclep",
        group="flex-settings",
        fields=("model.moe_expert_rank_capacity_factor", "model.moe_token_dispatcher_type",
                "model.moe_flex_dispatcher_backend"),
        applies=lambda cfg, ctx: _capacity(cfg) is not None,
        holds=_on(("hybridep", "ncclep")),
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
    Rule(
        id="rank-capacity-factor-hybridep-needs-op-fuser",
        group="flex-settings",
        fields=("model.moe_expert_rank_capacity_factor", "model.use_transformer_engine_op_fuser",
                "model.layer_spec"),
        applies=lambda cfg, ctx: _capacity(cfg) is not None and flex_backend(cfg) == "hybridep",
        holds=lambda cfg, ctx: bool(cfg.model.use_transformer_engine_op_fuser) and layers_use_te(cfg, ctx),
        message="HybridEP with a per-rank budget hands the experts a fixed-size, padded buffer: megatron-core "
        "requires Transformer Engine's fused grouped MLP (the op fuser) to consume it, which the "
        "torch-native and local experts do not have; tokens over the budget are dropped",
        fix=f"use {_OP_FUSER_FIX}, or set model.moe_expert_rank_capacity_factor=null (dropless, sized per step)",
        extra_values=TE_VERSION_VALUE,
    ),
    Rule(
        id="ncclep-needs-rank-capacity-factor",
        group="flex-settings",
        fields=("model.moe_flex_dispatcher_backend", "model.moe_expert_rank_capacity_factor"),
        applies=_NCCLEP,
        holds=lambda cfg, ctx: _capacity(cfg) is not None,
        message="megatron-core 0.19.2's NCCL EP dispatcher sizes its per-rank receive buffer from "
        "moe_expert_rank_capacity_factor and refuses to build without it; a routing over the budget stops "
        "the job (no tokens are dropped)",
        fix="set model.moe_expert_rank_capacity_factor generously (e.g. 1.5)",
    ),
    Rule(
        id="ncclep-settings-need-ncclep",
        group="flex-settings",
        fields=("model.moe_ncclep_static_shape", "model.moe_ncclep_zero_copy", "model.moe_flex_dispatcher_backend"),
        applies=lambda cfg, ctx: bool(cfg.model.moe_ncclep_static_shape or cfg.model.moe_ncclep_zero_copy),
        holds=_NCCLEP,
        message="moe_ncclep_static_shape and moe_ncclep_zero_copy are read only by the NCCL EP dispatcher; "
        "with another dispatcher they would do nothing",
        fix="set model.moe_ncclep_static_shape=false and model.moe_ncclep_zero_copy=false, or select ncclep",
    ),
    Rule(
        id="ncclep-zero-copy-needs-static-shape",
        group="flex-settings",
        fields=("model.moe_ncclep_zero_copy", "model.moe_ncclep_static_shape"),
        applies=lambda cfg, ctx: _NCCLEP(cfg, ctx) and bool(cfg.model.moe_ncclep_zero_copy),
        holds=lambda cfg, ctx: bool(cfg.model.moe_ncclep_static_shape),
        message="NCCL EP's zero-copy path writes into fixed-size symmetric-memory buffers, so it needs the "
        "static shape (megatron-core refuses it otherwise)",
        fix="set model.moe_ncclep_static_shape=true as well, or model.moe_ncclep_zero_copy=false",
    ),
    Rule(
        id="ncclep-static-shape-needs-fused-grouped-experts",
        group="flex-settings",
        fields=("model.moe_ncclep_static_shape", "model.use_transformer_engine_op_fuser",
                "model.moe_grouped_gemm", "model.layer_spec"),
        applies=lambda cfg, ctx: _NCCLEP(cfg, ctx) and bool(cfg.model.moe_ncclep_static_shape),
        holds=lambda cfg, ctx: bool(cfg.model.use_transformer_engine_op_fuser and cfg.model.moe_grouped_gemm)
        and layers_use_te(cfg, ctx),
        message="with the static shape the experts get the whole fixed-size receive buffer and must read "
        "the per-expert counts on the GPU: only Transformer Engine's fused grouped MLP (the op fuser over "
        "grouped experts) does; megatron-core refuses the static shape without it",
        fix=f"use {_OP_FUSER_FIX}, or set model.moe_ncclep_static_shape=false (eager: sized per step)",
    ),
    Rule(
        id="ncclep-static-shape-low-precision-needs-blackwell",
        group="flex-settings",
        fields=("model.moe_ncclep_static_shape", "mixed_precision"),
        applies=lambda cfg, ctx: _NCCLEP(cfg, ctx) and _static_shape_low_precision(cfg, ctx)
        and _capability_major(ctx) is not None,
        holds=lambda cfg, ctx: _capability_major(ctx) >= 10,
        message="NCCL EP's static shape with FP8/FP4 runs the experts through the CuTe DSL grouped GEMM, "
        "which needs a Blackwell GPU (sm100 or later) and NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 in the job's "
        "environment; megatron-core refuses it on older GPUs",
        fix="set model.moe_ncclep_static_shape=false on Hopper, or train on B200/B300/GB200/GB300",
        extra_values=(("target_gpu", _gpu_text),),
    ),
    Rule(
        id="ncclep-ep-overlap-syncs-without-static-shape",
        group="flex-settings",
        severity="warning",
        fields=("comm_overlap.overlap_moe_expert_parallel_comm", "model.moe_ncclep_static_shape"),
        applies=lambda cfg, ctx: _NCCLEP(cfg, ctx) and ep_on(cfg, ctx),
        holds=lambda cfg, ctx: bool(cfg.model.moe_ncclep_static_shape),
        message="with NCCL EP sized per step (moe_ncclep_static_shape=false) each dispatch waits on the host "
        "for the received token count, which serialises the EP-overlap schedule: it trains correctly but "
        "overlaps little (megatron-core warns the same)",
        fix="set model.moe_ncclep_static_shape=true (Transformer Engine's fused grouped MLP; FP8/FP4 on "
        "Blackwell), or compare step times with EP overlap off",
    ),
)
"""The flex backends' own settings: what ``cfg.validate()`` checks beyond the choice of backend."""


def describe_dispatcher(model: Any) -> str:
    """Which dispatch path runs, for the start-up line and the overlap report:
    ``flex, backend ncclep (static shape, zero copy off, per-rank capacity factor 1.5, SMs: backend default)``."""
    if model.moe_token_dispatcher_type != "flex" or model.moe_flex_dispatcher_backend is None:
        return str(model.moe_token_dispatcher_type)
    backend, sms = model.moe_flex_dispatcher_backend, effective_num_sms(model)
    parts = []
    if backend == "ncclep":
        parts.append("static shape" if model.moe_ncclep_static_shape else "sized per step (host sync)")
        parts.append(f"zero copy {'on' if model.moe_ncclep_zero_copy else 'off'}")
    if backend in ("hybridep", "ncclep"):
        factor = model.moe_expert_rank_capacity_factor
        parts.append("no per-rank budget" if factor is None else f"per-rank capacity factor {factor}")
    parts.append(f"SMs: {'backend default' if sms is None else sms}")
    return f"flex, backend {backend} ({', '.join(parts)})"


__all__ = [
    "FLEX_BACKEND_SUPPORT",
    "FLEX_RULES",
    "FLEX_SETTING_RULES",
    "NUM_SMS_FIELDS",
    "BackendSupport",
    "backend_support",
    "describe_dispatcher",
    "dispatcher_fields",
    "effective_num_sms",
    "flex_backend",
    "render_support_table",
    "sm_counts",
]
"""The support table's names (``flex_gpu_support.py``) are re-exported: the rules and their table are
imported from here."""
