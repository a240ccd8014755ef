"""Communication overlap: one owner per switch, computed defaults in one place, prerequisites as data.

``CommOverlapConfig`` is the single user-facing owner of every overlap switch. At ``cfg.finalize()``
(which works on a deep copy) :func:`resolve_comm_overlap`

1. decides the effective value of every switch (:data:`OVERLAP_FIELDS`): an explicit value wins;
   ``None`` means "framework decides" and is computed here, and only here;
2. writes the effective values to the model, optimizer and DDP configs and back to
   ``cfg.comm_overlap`` (so the resolved copy describes itself), recording ``computed`` in
   ``cfg.provenance`` for values the framework chose;
3. checks every prerequisite in :data:`OVERLAP_RULES` and returns all violations at once.

Because it runs on every finalize, edits made after a first ``validate()`` take effect (the
reference snapshots user values once and ignores later edits).

Ownership policy (never a silent reset): ``comm_overlap.<switch>`` owns the switch. A value set
directly on a target field (e.g. ``model.overlap_moe_expert_parallel_comm``) is honoured while the
owner is ``None``; when the owner is set and a target was set to a *different* value, that is an
``overlap-owner-conflict`` error naming both fields.

``python -m megatron.bridge.training.comm_overlap --write-docs`` regenerates
``docs/training/communication-overlap.md`` from the tables (a unit test checks it is current).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from packaging.version import Version

from megatron.bridge.training.errors import Violation
from megatron.bridge.training.rules import (
    TE_VERSION_VALUE,
    Rule,
    RuleContext,
    check_rules,
    read_field,
)

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

logger = logging.getLogger(__name__)

DEFAULT_BUCKET_SIZE = 128 * 1024 * 1024
"""Grad-reduce/param-gather bucket (bytes) chosen when the distributed optimizer runs with DP > 1."""

USER_LAYERS = ("recipe", "yaml", "flag", "cli")
"""Layers that may set a value, lowest first; ``computed`` marks values the framework chose."""


@dataclass(kw_only=True)
class CommOverlapConfig:
    """User-facing overlap switches. ``None`` means "let the framework decide" (see OVERLAP_FIELDS).

    An explicit value always wins and is never silently changed: if it cannot be honoured,
    ``cfg.validate()`` raises ``CommOverlapConfigError`` naming the field and the fix.
    """

    tp_comm_overlap: Optional[bool] = None
    """Overlap tensor-parallel communication with GEMMs (TE userbuffers; TP>=2, sequence parallel)."""
    tp_comm_overlap_cfg: Optional[dict[str, Any]] = None
    """Per-GEMM userbuffer settings for TP overlap; ``None`` uses Transformer Engine's defaults."""
    tp_comm_bootstrap_backend: Optional[str] = None
    """Bootstrap backend of the TP-overlap userbuffers (``nccl``, ``mpi``, ``gloo``)."""
    overlap_p2p_comm: Optional[bool] = None
    """Overlap pipeline send/recv with compute (interleaved pipeline schedule only)."""
    batch_p2p_comm: Optional[bool] = None
    """Batch pipeline send/recv into one call (excludes overlap_p2p_comm)."""
    overlap_grad_reduce: Optional[bool] = None
    """Overlap data-parallel gradient reduce-scatter/all-reduce with the backward pass."""
    overlap_param_gather: Optional[bool] = None
    """Overlap the distributed optimizer's parameter all-gather with the forward pass."""
    overlap_param_gather_with_optimizer_step: Optional[bool] = None
    """Start the parameter all-gather of the first chunk inside the optimizer step."""
    align_param_gather: Optional[bool] = None
    """Launch the param all-gathers of all pipeline stages together (interleaved pipelines)."""
    bucket_size: Optional[int] = None
    """Gradient/parameter bucket size in bytes for the overlapped collectives."""
    defer_embedding_wgrad_compute: Optional[bool] = None
    """Defer the output-embedding weight-gradient GEMMs to the pipeline flush."""
    wgrad_deferral_limit: Optional[int] = None
    """How many micro-batches of embedding wgrad may be deferred (0 = all)."""
    overlap_moe_expert_parallel_comm: Optional[bool] = None
    """Overlap the MoE expert-parallel dispatch/combine all-to-all with compute of another micro-batch."""
    delay_wgrad_compute: Optional[bool] = None
    """Delay expert weight-gradient GEMMs so they overlap the combine all-to-all (needs EP overlap)."""


# --------------------------------------------------------------------------------------------
# Effective values: which layer set each switch
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EffectiveValue:
    """The value a switch ends up with, the layer that set it, and why."""

    name: str
    value: Any
    source: str
    """``recipe``, ``yaml``, ``flag``, ``cli`` or ``computed``."""
    detail: str = ""

    @property
    def key(self) -> str:
        """Dotted key of the owner field."""
        return f"comm_overlap.{self.name}"


Partial = dict[str, EffectiveValue]
ComputeFn = Callable[["ConfigContainer", Partial, RuleContext], tuple[Any, str]]


@dataclass(frozen=True)
class OverlapField:
    """One switch of ``CommOverlapConfig``: where it is applied and how ``None`` is decided."""

    name: str
    targets: tuple[str, ...]
    compute: Optional[ComputeFn] = None
    """``None``: keep the target's own default (value read from the first target)."""
    rule_text: str = "keeps the megatron-core default"


def _value(partial: Partial, name: str) -> Any:
    return partial[name].value if name in partial else None


def _pipeline(cfg: "ConfigContainer") -> tuple[int, Optional[int]]:
    return cfg.model.pipeline_model_parallel_size, cfg.model.virtual_pipeline_model_parallel_size


def _data_parallel(cfg: "ConfigContainer", ctx: RuleContext) -> Optional[int]:
    from megatron.bridge.training.validation import data_parallel_size

    if ctx.world_size is None:
        return None
    return data_parallel_size(cfg, ctx.world_size)


def _compute_overlap_p2p(cfg, partial, ctx):
    pp, vpp = _pipeline(cfg)
    if pp > 1 and vpp is not None:
        if _value(partial, "batch_p2p_comm") is True:
            return False, "PP>1 with VPP, but batch_p2p_comm was set explicitly"
        return True, "PP>1 with VPP: the interleaved schedule overlaps p2p"
    return False, "needs PP>1 with VPP"


def _compute_batch_p2p(cfg, partial, ctx):
    pp, _ = _pipeline(cfg)
    if pp > 1 and not _value(partial, "overlap_p2p_comm"):
        return True, "PP>1 without overlapped p2p: batched p2p"
    return False, "PP=1 or p2p overlapped"


def _distributed_dp(cfg, ctx) -> tuple[Optional[bool], str]:
    """Whether the distributed optimizer runs with DP>1 (``None`` when DP is unknown)."""
    if not cfg.ddp.use_distributed_optimizer:
        return False, "no distributed optimizer"
    dp = _data_parallel(cfg, ctx)
    if dp is None:
        return None, "data-parallel size unknown (no world size given): left off"
    return dp > 1, f"distributed optimizer with DP={dp}"


def gloo_on_cuda(cfg: "ConfigContainer") -> bool:
    """Ranks on GPUs talking over gloo (e.g. two ranks sharing one GPU, where NCCL refuses)."""
    return cfg.dist.device == "cuda" and cfg.dist.effective_backend == "gloo"


def _compute_dp_overlap(cfg, partial, ctx):
    """Grad-reduce and param-gather overlap: on with the distributed optimizer and DP > 1."""
    if gloo_on_cuda(cfg):
        return False, "gloo on CUDA tensors runs DP collectives synchronously"
    on, why = _distributed_dp(cfg, ctx)
    return bool(on), why


def _compute_bucket(cfg, partial, ctx):
    if cfg.ddp.num_buckets is not None:
        return None, "ddp.num_buckets is set"
    on, why = _distributed_dp(cfg, ctx)
    if on and (_value(partial, "overlap_grad_reduce") or _value(partial, "overlap_param_gather")):
        return DEFAULT_BUCKET_SIZE, f"{why}: 128 MiB buckets"
    return cfg.ddp.bucket_size, "no overlapped DP collectives: megatron-core's default"


def _compute_align(cfg, partial, ctx):
    pp, vpp = _pipeline(cfg)
    if pp > 1 and vpp is not None and _value(partial, "overlap_param_gather"):
        return True, "interleaved pipeline with overlapped param gather"
    return False, "needs PP>1 with VPP and overlapped param gather"


def _off(reason: str) -> ComputeFn:
    return lambda cfg, partial, ctx: (False, reason)


OVERLAP_FIELDS: tuple[OverlapField, ...] = (
    OverlapField(
        "tp_comm_overlap", ("model.tp_comm_overlap",), _off("off unless requested"), "off unless requested"
    ),
    OverlapField("tp_comm_overlap_cfg", ()),
    OverlapField("tp_comm_bootstrap_backend", ("model.tp_comm_bootstrap_backend",)),
    OverlapField(
        "overlap_p2p_comm", ("model.overlap_p2p_comm",), _compute_overlap_p2p, "on when PP>1 with VPP"
    ),
    OverlapField(
        "batch_p2p_comm", ("model.batch_p2p_comm",), _compute_batch_p2p, "on when PP>1 without VPP"
    ),
    OverlapField(
        "overlap_grad_reduce",
        ("ddp.overlap_grad_reduce",),
        _compute_dp_overlap,
        "on with the distributed optimizer and DP>1",
    ),
    OverlapField(
        "overlap_param_gather",
        ("ddp.overlap_param_gather", "optimizer.overlap_param_gather"),
        _compute_dp_overlap,
        "on with the distributed optimizer and DP>1",
    ),
    OverlapField(
        "overlap_param_gather_with_optimizer_step",
        ("optimizer.overlap_param_gather_with_optimizer_step",),
        _off("off unless requested"),
        "off unless requested",
    ),
    OverlapField(
        "align_param_gather",
        ("ddp.align_param_gather",),
        _compute_align,
        "on when PP>1 with VPP and param gather is overlapped",
    ),
    OverlapField(
        "bucket_size",
        ("ddp.bucket_size",),
        _compute_bucket,
        "128 MiB with the distributed optimizer and DP>1",
    ),
    OverlapField("defer_embedding_wgrad_compute", ("model.defer_embedding_wgrad_compute",)),
    OverlapField("wgrad_deferral_limit", ("model.wgrad_deferral_limit",)),
    OverlapField(
        "overlap_moe_expert_parallel_comm",
        ("model.overlap_moe_expert_parallel_comm",),
        _off("off unless requested"),
        "off unless requested (pitfall 4: switch on by override)",
    ),
    OverlapField(
        "delay_wgrad_compute",
        ("model.delay_wgrad_compute", "ddp.delay_wgrad_compute"),
        _off("off unless requested"),
        "off unless requested",
    ),
)
OVERLAP_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in OVERLAP_FIELDS)
BOOL_SWITCHES: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(CommOverlapConfig) if f.type == "Optional[bool]"
)


def _field_default(obj: Any, name: str) -> Any:
    """The dataclass default of ``obj.name`` (the class's own, so subclass presets count)."""
    for f in dataclasses.fields(obj):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    return dataclasses.MISSING


def _layer(cfg: "ConfigContainer", key: str) -> str:
    return cfg.provenance.get(key, "recipe")


def _target_is_explicit(cfg: "ConfigContainer", key: str) -> bool:
    """A target field counts as set by the user when a layer recorded it or it left its default."""
    layer = cfg.provenance.get(key)
    if layer is not None:
        return layer != "computed"
    owner_path, _, name = key.rpartition(".")
    owner = read_field(cfg, owner_path)
    return read_field(cfg, key) != _field_default(owner, name)


def _conflict(rule: str, cfg: "ConfigContainer", keys: list[str], message: str, fix: str) -> Violation:
    return Violation(
        rule=rule,
        fields=tuple(keys),
        values=tuple(f"{read_field(cfg, k)!r} ({_layer(cfg, k)})" for k in keys),
        message=message,
        fix=fix,
    )


def _explicit_value(
    cfg: "ConfigContainer", spec: OverlapField
) -> tuple[Optional[EffectiveValue], list[Violation]]:
    """The user's value for a switch (owner first, then targets), or ``None`` when unset."""
    owner_key = f"comm_overlap.{spec.name}"
    owner = getattr(cfg.comm_overlap, spec.name)
    explicit_targets = [t for t in spec.targets if _target_is_explicit(cfg, t)]
    if owner is not None:
        clashing = [t for t in explicit_targets if read_field(cfg, t) != owner]
        problems = [
            _conflict(
                "overlap-owner-conflict",
                cfg,
                [owner_key, *clashing],
                f"{owner_key} owns this switch, but {', '.join(clashing)} was set to a different value",
                f"set only {owner_key} (the owner) and leave {', '.join(clashing)} unset",
            )
        ] if clashing else []
        source = _layer(cfg, owner_key)
        detail = "as resolved by finalize" if source == "computed" else ""
        return EffectiveValue(spec.name, owner, source, detail), problems
    if not explicit_targets:
        return None, []
    values = {repr(read_field(cfg, t)) for t in explicit_targets}
    if len(values) > 1:
        return None, [
            _conflict(
                "overlap-target-conflict",
                cfg,
                explicit_targets,
                f"these fields are all driven by {owner_key} and were set to different values",
                f"set {owner_key} instead of the individual fields",
            )
        ]
    first = explicit_targets[0]
    return (
        EffectiveValue(spec.name, read_field(cfg, first), _layer(cfg, first), f"set on {first}"),
        [],
    )


def resolve_overlap_values(
    cfg: "ConfigContainer", ctx: RuleContext
) -> tuple[dict[str, EffectiveValue], list[Violation]]:
    """Decide every switch without changing ``cfg``: explicit values first, then computed ones.

    This is the one place computed defaults are decided; it returns ownership conflicts as
    violations instead of picking a winner.
    """
    effective: Partial = {}
    problems: list[Violation] = []
    for spec in OVERLAP_FIELDS:
        value, conflicts = _explicit_value(cfg, spec)
        problems += conflicts
        if value is not None:
            effective[spec.name] = value
    for spec in OVERLAP_FIELDS:
        if spec.name in effective:
            continue
        if spec.compute is not None:
            value, why = spec.compute(cfg, effective, ctx)
        else:
            value = read_field(cfg, spec.targets[0]) if spec.targets else None
            why = "framework default"
        effective[spec.name] = EffectiveValue(spec.name, value, "computed", why)
    return {name: effective[name] for name in OVERLAP_FIELD_NAMES}, problems


def apply_overlap_values(cfg: "ConfigContainer", effective: dict[str, EffectiveValue]) -> None:
    """Write effective values to their targets and back to ``cfg.comm_overlap`` (with provenance)."""
    for spec in OVERLAP_FIELDS:
        chosen = effective[spec.name]
        for target in spec.targets:
            owner_path, _, name = target.rpartition(".")
            setattr(read_field(cfg, owner_path), name, chosen.value)
        setattr(cfg.comm_overlap, spec.name, chosen.value)
        if chosen.source == "computed":
            for key in (chosen.key, *spec.targets):
                cfg.provenance[key] = "computed"
        elif chosen.source != "recipe":
            cfg.provenance[chosen.key] = chosen.source


def resolve_comm_overlap(cfg: "ConfigContainer", ctx: RuleContext) -> list[Violation]:
    """Resolve, apply and check the overlap settings of ``cfg`` (a private copy); all violations.

    Called by ``finalize_config`` after the precision flags are derived. A ``comm_overlap`` of
    ``None`` (e.g. from an old recipe or YAML) means "all switches unset", never a crash.
    """
    if cfg.comm_overlap is None:
        cfg.comm_overlap = CommOverlapConfig()
    effective, conflicts = resolve_overlap_values(cfg, ctx)
    if conflicts:
        return conflicts + check_rules(TYPE_RULES, cfg, ctx)
    apply_overlap_values(cfg, effective)
    return check_rules(OVERLAP_RULES, cfg, ctx)


def effective_overlap_values(
    cfg: "ConfigContainer", ctx: Optional[RuleContext] = None
) -> dict[str, EffectiveValue]:
    """Each overlap switch's effective value and the layer that set it (for ``--dryrun``).

    On a user config this decides the computed values (with their reasons) for ``ctx``; on a
    resolved copy it reports the values finalize applied (their provenance says ``computed``).
    ``cfg`` is not changed.
    """
    from megatron.bridge.training.finalize import default_rule_context

    if cfg.comm_overlap is None:
        cfg = dataclasses.replace(cfg, comm_overlap=CommOverlapConfig())
    effective, _ = resolve_overlap_values(cfg, ctx or default_rule_context())
    return effective


def format_effective_values(effective: dict[str, EffectiveValue]) -> str:
    """One line per switch: ``comm_overlap.x = value  [source: detail]``."""
    width = max(len(v.key) for v in effective.values())
    lines = []
    for v in effective.values():
        detail = f": {v.detail}" if v.detail else ""
        lines.append(f"{v.key:<{width}} = {v.value!r}  [{v.source}{detail}]")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Facts the rules read
# --------------------------------------------------------------------------------------------


def _torch_text(ctx: RuleContext) -> str:
    return "unknown" if ctx.torch_version is None else str(ctx.torch_version)


def _te_at_least(ctx: RuleContext, version: str) -> bool:
    return ctx.te_version is not None and ctx.te_version >= Version(version)


def resolved_layer_spec(cfg: "ConfigContainer", ctx: RuleContext) -> str:
    """The layer implementation the run will build on the machine ``ctx`` describes."""
    from megatron.bridge.models.layer_specs import resolve_layer_spec

    return resolve_layer_spec(cfg.model.layer_spec, te_available=ctx.te_version is not None)


def layers_use_te(cfg: "ConfigContainer", ctx: RuleContext) -> bool:
    """Whether the built layers will be Transformer Engine modules on the machine ``ctx`` describes."""
    return resolved_layer_spec(cfg, ctx) == "transformer_engine"


def experts_defer_wgrad(cfg: "ConfigContainer", ctx: RuleContext) -> bool:
    """Whether the expert layers implement a real ``backward_dw`` (TE or torch-native grouped GEMM)."""
    return resolved_layer_spec(cfg, ctx) in ("transformer_engine", "torch_native")


def graph_modules(model: Any) -> frozenset[str]:
    """Names of the per-layer CUDA-graph capture regions; empty means the whole layer.

    Reads megatron-core 0.19's ``cuda_graph_modules`` and the deprecated ``cuda_graph_scope``,
    raw (strings, ``"full"``) or normalised (``CudaGraphModule`` members).
    """
    raw = model.cuda_graph_scope if getattr(model, "cuda_graph_scope", None) else model.cuda_graph_modules
    if raw is None:
        return frozenset()
    items = raw if isinstance(raw, (list, tuple)) else (raw.split(",") if isinstance(raw, str) else [raw])
    names = {getattr(i, "name", i) for i in items}
    names.discard("")
    names.discard("full")
    return frozenset(str(n).strip() for n in names)


def _per_layer_graphs(cfg: "ConfigContainer") -> bool:
    return cfg.model.cuda_graph_impl in ("local", "transformer_engine")


def _has_shared_expert(cfg: "ConfigContainer") -> bool:
    return cfg.model.moe_shared_expert_intermediate_size is not None


def wgrad_in_graph_scope(cfg: "ConfigContainer") -> bool:
    """Delayed wgrad inside a captured region: attention (or the whole layer), or ``moe_router``
    when it captures a shared expert that is not overlapped."""
    if not _per_layer_graphs(cfg):
        return False
    scopes = graph_modules(cfg.model)
    router_with_shared = (
        "moe_router" in scopes and _has_shared_expert(cfg) and not cfg.model.moe_shared_expert_overlap
    )
    return not scopes or "attn" in scopes or router_with_shared


def _ep_on(cfg: "ConfigContainer", ctx: RuleContext) -> bool:
    return bool(cfg.model.overlap_moe_expert_parallel_comm)


def _dw_on(cfg: "ConfigContainer", ctx: RuleContext) -> bool:
    return bool(cfg.model.delay_wgrad_compute)


def _dw_te(cfg: "ConfigContainer", ctx: RuleContext) -> bool:
    return _dw_on(cfg, ctx) and ctx.te_version is not None


def _dw_graph(cfg: "ConfigContainer", ctx: RuleContext) -> bool:
    return _dw_te(cfg, ctx) and wgrad_in_graph_scope(cfg)


def _precision_ok(cfg: "ConfigContainer", ctx: RuleContext) -> bool:
    from megatron.bridge.training.mixed_precision import mixed_precision_recipe

    recipe = mixed_precision_recipe(cfg.mixed_precision)
    return recipe is None or recipe.bf16 or recipe.fp16  # unknown names: general rule reports


def _micro_batches(cfg: "ConfigContainer", ctx: RuleContext) -> Optional[int]:
    dp = _data_parallel(cfg, ctx)
    if not dp or cfg.train.micro_batch_size < 1:
        return None
    return cfg.train.global_batch_size // (cfg.train.micro_batch_size * dp)


def _flex(cfg: "ConfigContainer") -> bool:
    return cfg.model.moe_token_dispatcher_type == "flex"


def _flex_backend_known(cfg: "ConfigContainer") -> bool:
    from megatron.bridge.training.flex_dispatcher_backend import BACKEND_SUPPORT

    return _flex(cfg) and cfg.model.moe_flex_dispatcher_backend in BACKEND_SUPPORT


def _gpu_support(cfg: "ConfigContainer", ctx: RuleContext) -> Optional[bool]:
    from megatron.bridge.training.flex_dispatcher_backend import backend_support, gpu_target_from_context

    supported, _ = backend_support(cfg.model.moe_flex_dispatcher_backend, gpu_target_from_context(ctx))
    return supported


def _gpu_text(ctx: RuleContext) -> str:
    from megatron.bridge.training.flex_dispatcher_backend import gpu_target_from_context

    return gpu_target_from_context(ctx).describe()


def _deep_ep_text(ctx: RuleContext) -> str:
    return {True: "importable", False: "not importable", None: "unknown"}[ctx.deep_ep_available]


def _host_text(ctx: RuleContext) -> str:
    return "GPU host" if ctx.cuda_available else "CPU host (dry run)"


_TE = TE_VERSION_VALUE
_RECOMPUTE_FIX = "use selective recompute (recompute_granularity=selective, e.g. recompute_modules=[moe_act])"
_DW_FIX_OFF = "or set comm_overlap.delay_wgrad_compute=false"


def _rule(**kw) -> Rule:
    return Rule(**kw)


EP_OVERLAP_RULES: tuple[Rule, ...] = (
    _rule(
        id="ep-overlap-needs-expert-parallel",
        group="ep-overlap",
        fields=("model.expert_model_parallel_size",),
        applies=_ep_on,
        holds=lambda cfg, ctx: cfg.model.expert_model_parallel_size > 1,
        message="EP overlap hides the expert-parallel all-to-all; it needs expert parallelism",
        fix="set model.expert_model_parallel_size > 1, or comm_overlap.overlap_moe_expert_parallel_comm=false",
    ),
    _rule(
        id="ep-overlap-needs-moe-experts",
        group="ep-overlap",
        fields=("model.num_moe_experts",),
        applies=_ep_on,
        holds=lambda cfg, ctx: (cfg.model.num_moe_experts or 0) > 1,
        message="EP overlap needs an MoE model with more than one expert",
        fix="set model.num_moe_experts > 1, or comm_overlap.overlap_moe_expert_parallel_comm=false",
    ),
    _rule(
        id="ep-overlap-needs-alltoall-or-flex",
        group="ep-overlap",
        fields=("model.moe_token_dispatcher_type",),
        applies=_ep_on,
        holds=lambda cfg, ctx: cfg.model.moe_token_dispatcher_type in ("alltoall", "flex"),
        message="EP overlap runs only with the alltoall or flex token dispatcher",
        fix="set model.moe_token_dispatcher_type=alltoall (or flex with a backend)",
    ),
    _rule(
        id="ep-overlap-needs-bf16-or-fp16",
        group="ep-overlap",
        fields=("mixed_precision",),
        applies=_ep_on,
        holds=_precision_ok,
        message="EP overlap needs a bf16 or fp16 model (precision is owned by mixed_precision)",
        fix="set mixed_precision=bf16_mixed (-c bf16) or fp16_mixed",
    ),
    _rule(
        id="ep-overlap-pp-needs-vpp",
        group="ep-overlap",
        fields=("model.pipeline_model_parallel_size", "model.virtual_pipeline_model_parallel_size"),
        applies=lambda cfg, ctx: _ep_on(cfg, ctx) and cfg.model.pipeline_model_parallel_size > 1,
        holds=lambda cfg, ctx: cfg.model.virtual_pipeline_model_parallel_size is not None,
        message="with pipeline parallelism the overlap needs the interleaved schedule (pitfall 2)",
        fix="set model.virtual_pipeline_model_parallel_size (e.g. 2), or pipeline_model_parallel_size=1",
    ),
    _rule(
        id="ep-overlap-no-full-recompute",
        group="ep-overlap",
        fields=("model.recompute_granularity",),
        applies=_ep_on,
        holds=lambda cfg, ctx: cfg.model.recompute_granularity != "full",
        message="full recompute is not a companion of the EP-overlap path",
        fix=_RECOMPUTE_FIX,
    ),
    _rule(
        id="ep-overlap-no-recompute-method",
        group="ep-overlap",
        fields=("model.recompute_method",),
        applies=_ep_on,
        holds=lambda cfg, ctx: cfg.model.recompute_method is None,
        message="EP overlap needs recompute_method unset (uniform/block belong to full recompute)",
        fix="set model.recompute_method=null; " + _RECOMPUTE_FIX,
    ),
    _rule(
        id="ep-overlap-no-recompute-num-layers",
        group="ep-overlap",
        fields=("model.recompute_num_layers",),
        applies=_ep_on,
        holds=lambda cfg, ctx: cfg.model.recompute_num_layers is None,
        message="EP overlap needs recompute_num_layers unset",
        fix="set model.recompute_num_layers=null",
    ),
    _rule(
        id="ep-overlap-no-moe-recompute",
        group="ep-overlap",
        fields=("model.recompute_modules",),
        applies=_ep_on,
        holds=lambda cfg, ctx: "moe" not in (cfg.model.recompute_modules or ()),
        message="recomputing the whole MoE module re-runs the all-to-all the overlap hides",
        fix="remove 'moe' from model.recompute_modules (moe_act is fine)",
    ),
    _rule(
        id="ep-overlap-no-shared-expert-overlap",
        group="ep-overlap",
        fields=("model.moe_shared_expert_overlap",),
        applies=_ep_on,
        holds=lambda cfg, ctx: not cfg.model.moe_shared_expert_overlap,
        message="shared-expert overlap conflicts with dispatch overlap (pitfall 1)",
        fix="set model.moe_shared_expert_overlap=false",
    ),
    _rule(
        id="ep-overlap-max-one-mtp-layer",
        group="ep-overlap",
        fields=("model.mtp_num_layers",),
        applies=_ep_on,
        holds=lambda cfg, ctx: cfg.model.mtp_num_layers in (None, 0, 1),
        message="EP overlap supports at most one multi-token-prediction layer",
        fix="set model.mtp_num_layers to null, 0 or 1",
    ),
    _rule(
        id="ep-overlap-needs-torch-2.6",
        group="ep-overlap",
        fields=("comm_overlap.overlap_moe_expert_parallel_comm",),
        applies=_ep_on,
        holds=lambda cfg, ctx: ctx.torch_version is None or ctx.torch_version >= Version("2.6"),
        message="EP overlap hangs with torch < 2.6",
        fix="install torch >= 2.6, or comm_overlap.overlap_moe_expert_parallel_comm=false",
        extra_values=(("torch", _torch_text),),
    ),
    _rule(
        id="ep-overlap-te-cuda-graph-scope",
        group="ep-overlap",
        fields=("model.cuda_graph_impl", "model.cuda_graph_modules"),
        applies=lambda cfg, ctx: _ep_on(cfg, ctx) and cfg.model.cuda_graph_impl == "transformer_engine",
        holds=lambda cfg, ctx: not (graph_modules(cfg.model) & {"moe", "mlp"}),
        message="with Transformer Engine CUDA graphs, the moe and mlp scopes cannot be captured with EP overlap",
        fix="drop moe/mlp from model.cuda_graph_modules (attn, moe_router, moe_preprocess are fine) "
        "or set model.cuda_graph_impl=none",
    ),
    _rule(
        id="ep-overlap-excludes-dispatch-wgrad-overlap",
        group="ep-overlap",
        fields=("model.overlap_dispatch_backward_with_experts_wgrad",),
        applies=_ep_on,
        holds=lambda cfg, ctx: not cfg.model.overlap_dispatch_backward_with_experts_wgrad,
        message="overlapping the dispatch backward with expert wgrad is an alternative to EP overlap, "
        "not a companion (megatron-core rule)",
        fix="set model.overlap_dispatch_backward_with_experts_wgrad=false",
    ),
    _rule(
        id="ep-overlap-needs-two-micro-batches",
        group="ep-overlap",
        severity="warning",
        fields=("train.global_batch_size", "train.micro_batch_size"),
        applies=lambda cfg, ctx: _ep_on(cfg, ctx) and _micro_batches(cfg, ctx) is not None,
        holds=lambda cfg, ctx: _micro_batches(cfg, ctx) >= 2,
        message="the overlap interleaves two micro-batches; with one there is nothing to overlap",
        fix="raise train.global_batch_size to at least 2 x micro_batch_size x DP",
        extra_values=(("world_size", lambda ctx: ctx.world_size),),
    ),
)

DELAY_WGRAD_RULES: tuple[Rule, ...] = (
    _rule(
        id="delay-wgrad-needs-ep-overlap",
        group="delay-wgrad",
        fields=("comm_overlap.delay_wgrad_compute", "comm_overlap.overlap_moe_expert_parallel_comm"),
        applies=_dw_on,
        holds=_ep_on,
        message="delayed wgrad only exists inside the EP-overlap schedule",
        fix="set comm_overlap.overlap_moe_expert_parallel_comm=true, " + _DW_FIX_OFF,
    ),
    _rule(
        id="delay-wgrad-no-op-with-local-layers",
        group="delay-wgrad",
        severity="warning",
        fields=("comm_overlap.delay_wgrad_compute", "model.layer_spec"),
        applies=_dw_on,
        holds=experts_defer_wgrad,
        message="with the plain megatron-core (local) layers delayed wgrad buys nothing (their "
        "linears compute wgrad in place); accepted so a CPU host can dry-run a TE cluster's config",
        fix="use layer_spec auto, torch_native or transformer_engine (their experts defer the "
        "wgrad GEMMs), " + _DW_FIX_OFF,
        extra_values=_TE,
    ),
    _rule(
        id="delay-wgrad-te-2.7",
        group="delay-wgrad",
        fields=("comm_overlap.overlap_grad_reduce", "model.gradient_accumulation_fusion"),
        applies=lambda cfg, ctx: _dw_te(cfg, ctx)
        and (cfg.ddp.overlap_grad_reduce or cfg.model.gradient_accumulation_fusion),
        holds=lambda cfg, ctx: _te_at_least(ctx, "2.7"),
        message="delayed wgrad with overlapped grad reduce or gradient-accumulation fusion needs TE >= 2.7",
        fix="upgrade Transformer Engine to >= 2.7, set comm_overlap.overlap_grad_reduce=false and "
        "model.gradient_accumulation_fusion=false, " + _DW_FIX_OFF,
        extra_values=_TE,
    ),
    _rule(
        id="delay-wgrad-te-cuda-graph-te-2.10",
        group="delay-wgrad",
        fields=("model.cuda_graph_impl",),
        applies=lambda cfg, ctx: _dw_te(cfg, ctx) and cfg.model.cuda_graph_impl == "transformer_engine",
        holds=lambda cfg, ctx: _te_at_least(ctx, "2.10"),
        message="delayed wgrad with Transformer Engine CUDA graphs needs TE >= 2.10 (megatron-core rule)",
        fix="upgrade Transformer Engine to >= 2.10, set model.cuda_graph_impl=none, " + _DW_FIX_OFF,
        extra_values=_TE,
    ),
    _rule(
        id="delay-wgrad-graph-scope-te-2.12",
        group="delay-wgrad",
        fields=("model.cuda_graph_impl", "model.cuda_graph_modules"),
        applies=_dw_graph,
        holds=lambda cfg, ctx: _te_at_least(ctx, "2.12"),
        message="delayed wgrad inside a CUDA-graph scope (attn/whole layer, or moe_router with a "
        "non-overlapped shared expert) needs TE >= 2.12",
        fix="upgrade Transformer Engine to >= 2.12, capture only moe_router/moe_preprocess, " + _DW_FIX_OFF,
        extra_values=_TE,
    ),
    _rule(
        id="delay-wgrad-graph-scope-needs-grad-accum-fusion",
        group="delay-wgrad",
        fields=("model.gradient_accumulation_fusion", "model.cuda_graph_modules"),
        applies=_dw_graph,
        holds=lambda cfg, ctx: bool(cfg.model.gradient_accumulation_fusion),
        message="delayed wgrad inside a CUDA-graph scope needs gradient-accumulation fusion",
        fix="set model.gradient_accumulation_fusion=true, or keep attention out of the graph scope",
    ),
    _rule(
        id="delay-wgrad-graph-scope-no-attention-bias",
        group="delay-wgrad",
        fields=("model.add_bias_linear", "model.add_qkv_bias", "model.cuda_graph_modules"),
        applies=_dw_graph,
        holds=lambda cfg, ctx: not cfg.model.add_bias_linear and not cfg.model.add_qkv_bias,
        message="delayed wgrad inside a CUDA-graph scope does not support attention bias",
        fix="set model.add_bias_linear=false and model.add_qkv_bias=false, or keep attention out of "
        "the graph scope",
    ),
)

CUDA_GRAPH_RULES: tuple[Rule, ...] = (
    _rule(
        id="te-cuda-graph-needs-te",
        group="cuda-graph",
        fields=("model.cuda_graph_impl",),
        applies=lambda cfg, ctx: cfg.model.cuda_graph_impl == "transformer_engine",
        holds=lambda cfg, ctx: ctx.te_version is not None,
        message="Transformer Engine CUDA graphs need Transformer Engine",
        fix="set model.cuda_graph_impl=none (--cuda_graph_impl none) or install the 'te' extra",
        extra_values=_TE,
    ),
)

SHARED_EXPERT_RULES: tuple[Rule, ...] = (
    _rule(
        id="shared-expert-overlap-needs-alltoall-or-flex",
        group="shared-expert",
        fields=("model.moe_shared_expert_overlap", "model.moe_token_dispatcher_type"),
        applies=lambda cfg, ctx: bool(cfg.model.moe_shared_expert_overlap),
        holds=lambda cfg, ctx: cfg.model.moe_token_dispatcher_type in ("alltoall", "flex"),
        message="shared-expert overlap only works with the alltoall or flex dispatcher",
        fix="set model.moe_token_dispatcher_type=alltoall, or model.moe_shared_expert_overlap=false",
    ),
    _rule(
        id="shared-expert-overlap-needs-shared-expert",
        group="shared-expert",
        severity="warning",
        fields=("model.moe_shared_expert_overlap", "model.moe_shared_expert_intermediate_size"),
        applies=lambda cfg, ctx: bool(cfg.model.moe_shared_expert_overlap),
        holds=lambda cfg, ctx: _has_shared_expert(cfg),
        message="shared-expert overlap does nothing: the model has no shared expert",
        fix="set model.moe_shared_expert_overlap=false",
    ),
)

TP_OVERLAP_RULES: tuple[Rule, ...] = (
    _rule(
        id="tp-overlap-needs-tp",
        group="tp-overlap",
        fields=("comm_overlap.tp_comm_overlap", "model.tensor_model_parallel_size"),
        applies=lambda cfg, ctx: bool(cfg.comm_overlap.tp_comm_overlap),
        holds=lambda cfg, ctx: cfg.model.tensor_model_parallel_size >= 2,
        message="TP comm overlap needs tensor parallelism (the reference silently disabled it)",
        fix="set model.tensor_model_parallel_size >= 2, or comm_overlap.tp_comm_overlap=false",
    ),
    _rule(
        id="tp-overlap-needs-sequence-parallel",
        group="tp-overlap",
        fields=("comm_overlap.tp_comm_overlap", "model.sequence_parallel"),
        applies=lambda cfg, ctx: bool(cfg.comm_overlap.tp_comm_overlap),
        holds=lambda cfg, ctx: bool(cfg.model.sequence_parallel),
        message="TP comm overlap needs sequence parallelism",
        fix="set model.sequence_parallel=true, or comm_overlap.tp_comm_overlap=false",
    ),
    _rule(
        id="tp-overlap-needs-te",
        group="tp-overlap",
        fields=("comm_overlap.tp_comm_overlap", "model.layer_spec"),
        applies=lambda cfg, ctx: bool(cfg.comm_overlap.tp_comm_overlap),
        holds=layers_use_te,
        message="TP comm overlap is implemented by Transformer Engine layers (userbuffers)",
        fix="install the 'te' extra and use layer_spec auto/transformer_engine, or comm_overlap.tp_comm_overlap=false",
        extra_values=_TE,
    ),
)

TP_OVERLAP_RULES += (
    _rule(
        id="tp-comm-bootstrap-backend-known",
        group="tp-overlap",
        fields=("comm_overlap.tp_comm_bootstrap_backend",),
        holds=lambda cfg, ctx: cfg.comm_overlap.tp_comm_bootstrap_backend in (None, "nccl", "mpi", "gloo"),
        message="unknown bootstrap backend for the TP-overlap userbuffers",
        fix="set comm_overlap.tp_comm_bootstrap_backend to nccl, mpi or gloo (or null)",
    ),
)

PIPELINE_DP_RULES: tuple[Rule, ...] = (
    _rule(
        id="p2p-overlap-needs-interleaved-pipeline",
        group="pipeline",
        fields=(
            "comm_overlap.overlap_p2p_comm",
            "model.pipeline_model_parallel_size",
            "model.virtual_pipeline_model_parallel_size",
        ),
        applies=lambda cfg, ctx: bool(cfg.model.overlap_p2p_comm),
        holds=lambda cfg, ctx: cfg.model.pipeline_model_parallel_size > 1
        and cfg.model.virtual_pipeline_model_parallel_size is not None,
        message="p2p overlap exists only in the interleaved pipeline schedule (PP>1 with VPP)",
        fix="set model.virtual_pipeline_model_parallel_size, or leave comm_overlap.overlap_p2p_comm unset",
    ),
    _rule(
        id="p2p-overlap-excludes-batch-p2p",
        group="pipeline",
        fields=("comm_overlap.overlap_p2p_comm", "comm_overlap.batch_p2p_comm"),
        applies=lambda cfg, ctx: bool(cfg.model.overlap_p2p_comm),
        holds=lambda cfg, ctx: not cfg.model.batch_p2p_comm,
        message="overlapped and batched p2p are mutually exclusive",
        fix="set one of comm_overlap.overlap_p2p_comm / batch_p2p_comm to false (or leave both unset)",
    ),
    _rule(
        id="param-gather-overlap-needs-distributed-optimizer",
        group="data-parallel",
        fields=("comm_overlap.overlap_param_gather", "ddp.use_distributed_optimizer"),
        applies=lambda cfg, ctx: bool(cfg.ddp.overlap_param_gather),
        holds=lambda cfg, ctx: bool(cfg.ddp.use_distributed_optimizer),
        message="param-gather overlap is a distributed-optimizer feature",
        fix="set ddp.use_distributed_optimizer=true (and optimizer.use_distributed_optimizer), or "
        "comm_overlap.overlap_param_gather=false",
    ),
    _rule(
        id="dp-overlap-needs-nccl-on-gpus",
        group="data-parallel",
        fields=(
            "comm_overlap.overlap_grad_reduce",
            "comm_overlap.overlap_param_gather",
            "dist.distributed_backend",
        ),
        applies=lambda cfg, ctx: gloo_on_cuda(cfg),
        holds=lambda cfg, ctx: not (cfg.ddp.overlap_grad_reduce or cfg.ddp.overlap_param_gather),
        message="gloo cannot coalesce collectives on CUDA tensors, so megatron's DP collectives run "
        "one by one, synchronously: overlapped grad reduce / param gather cannot be honoured",
        fix="set comm_overlap.overlap_grad_reduce=false and comm_overlap.overlap_param_gather=false, "
        "or run one rank per GPU over NCCL",
    ),
    _rule(
        id="param-gather-with-step-needs-param-gather-overlap",
        group="data-parallel",
        fields=("comm_overlap.overlap_param_gather_with_optimizer_step", "comm_overlap.overlap_param_gather"),
        applies=lambda cfg, ctx: bool(cfg.comm_overlap.overlap_param_gather_with_optimizer_step),
        holds=lambda cfg, ctx: bool(cfg.ddp.overlap_param_gather),
        message="overlapping the param gather with the optimizer step needs param-gather overlap",
        fix="set comm_overlap.overlap_param_gather=true, or overlap_param_gather_with_optimizer_step=false",
    ),
    _rule(
        id="defer-embedding-wgrad-needs-pipeline",
        group="pipeline",
        fields=("comm_overlap.defer_embedding_wgrad_compute", "model.pipeline_model_parallel_size"),
        applies=lambda cfg, ctx: bool(cfg.model.defer_embedding_wgrad_compute),
        holds=lambda cfg, ctx: cfg.model.pipeline_model_parallel_size > 1,
        message="embedding wgrad is deferred to the pipeline flush; there is none with PP=1",
        fix="set comm_overlap.defer_embedding_wgrad_compute=false, or use pipeline parallelism",
    ),
    _rule(
        id="defer-embedding-wgrad-needs-grad-accum-fusion",
        group="pipeline",
        fields=("comm_overlap.defer_embedding_wgrad_compute", "model.gradient_accumulation_fusion"),
        applies=lambda cfg, ctx: bool(cfg.model.defer_embedding_wgrad_compute),
        holds=lambda cfg, ctx: bool(cfg.model.gradient_accumulation_fusion),
        message="deferred embedding wgrad needs gradient-accumulation fusion",
        fix="set model.gradient_accumulation_fusion=true, or comm_overlap.defer_embedding_wgrad_compute=false",
    ),
)

FLEX_RULES: tuple[Rule, ...] = (
    _rule(
        id="flex-backend-needs-flex-dispatcher",
        group="flex-dispatcher",
        fields=("model.moe_flex_dispatcher_backend", "model.moe_token_dispatcher_type"),
        applies=lambda cfg, ctx: cfg.model.moe_flex_dispatcher_backend is not None,
        holds=lambda cfg, ctx: _flex(cfg),
        message="a flex backend does nothing while the dispatcher is not flex (pitfall 3)",
        fix="set model.moe_token_dispatcher_type=flex (or use --moe_flex_dispatcher_backend, which "
        "sets both), or model.moe_flex_dispatcher_backend=null for plain alltoall",
    ),
    _rule(
        id="flex-dispatcher-needs-backend",
        group="flex-dispatcher",
        fields=("model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend"),
        applies=lambda cfg, ctx: _flex(cfg),
        holds=lambda cfg, ctx: cfg.model.moe_flex_dispatcher_backend is not None,
        message="the flex dispatcher needs an explicit backend (no hidden megatron-core default)",
        fix="set model.moe_flex_dispatcher_backend=deepep or hybridep",
    ),
    _rule(
        id="flex-backend-supported-on-gpu",
        group="flex-dispatcher",
        fields=("model.moe_flex_dispatcher_backend",),
        applies=lambda cfg, ctx: _flex_backend_known(cfg),
        holds=lambda cfg, ctx: _gpu_support(cfg, ctx) is not False,
        message="this flex backend does not support the target GPU "
        "(DeepEP: Ampere, Hopper, B200/B300; HybridEP: Ampere, Hopper, Blackwell incl. GB200/GB300 NVL72)",
        fix="use model.moe_flex_dispatcher_backend=hybridep on GB200/GB300, or plain alltoall "
        "(--moe_flex_dispatcher_backend None)",
        extra_values=(("target_gpu", _gpu_text),),
    ),
    _rule(
        id="flex-backend-gpu-not-checked",
        group="flex-dispatcher",
        severity="warning",
        fields=("model.moe_flex_dispatcher_backend",),
        applies=lambda cfg, ctx: _flex_backend_known(cfg),
        holds=lambda cfg, ctx: _gpu_support(cfg, ctx) is not None,
        message="target GPU unknown (no -g/target GPU and no visible GPU): backend support not checked",
        fix="pass the GPU type (-g h100/b200/gb200...) to validate against the cluster's GPUs",
        extra_values=(("target_gpu", _gpu_text),),
    ),
    _rule(
        id="flex-needs-deep-ep",
        group="flex-dispatcher",
        fields=("model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend"),
        applies=lambda cfg, ctx: _flex_backend_known(cfg) and bool(ctx.cuda_available),
        holds=lambda cfg, ctx: ctx.deep_ep_available is not False,
        message="the flex dispatcher backends need the deep_ep package, which does not import here",
        fix="install DeepEP on the GPU machines (see https://github.com/deepseek-ai/DeepEP, hybrid-ep "
        "branch for hybridep), or use plain alltoall (--moe_flex_dispatcher_backend None)",
        extra_values=(("deep_ep", _deep_ep_text), ("host", _host_text)),
    ),
    _rule(
        id="flex-deep-ep-not-checked-on-cpu-host",
        group="flex-dispatcher",
        severity="warning",
        fields=("model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend"),
        applies=lambda cfg, ctx: _flex_backend_known(cfg) and not ctx.cuda_available,
        holds=lambda cfg, ctx: ctx.deep_ep_available is not False,
        message="note: deep_ep does not import on this CPU host; the GPU machines must have it",
        fix="make sure DeepEP is installed where the job runs",
        extra_values=(("deep_ep", _deep_ep_text), ("host", _host_text)),
    ),
)


def _switch_type_rule(name: str) -> Rule:
    key = f"comm_overlap.{name}"
    return _rule(
        id=f"overlap-switch-is-bool:{name}",
        group="types",
        fields=(key,),
        holds=lambda cfg, ctx: getattr(cfg.comm_overlap, name) is None
        or isinstance(getattr(cfg.comm_overlap, name), bool),
        message="overlap switches take true/false/null (a 1 or 'yes' would skip the checks)",
        fix=f"set {key}=true, false or null",
    )


TYPE_RULES: tuple[Rule, ...] = tuple(_switch_type_rule(name) for name in BOOL_SWITCHES)

OVERLAP_RULES: tuple[Rule, ...] = (
    TYPE_RULES
    + EP_OVERLAP_RULES
    + DELAY_WGRAD_RULES
    + CUDA_GRAPH_RULES
    + SHARED_EXPERT_RULES
    + TP_OVERLAP_RULES
    + PIPELINE_DP_RULES
    + FLEX_RULES
)
"""Every overlap prerequisite, in the order they are reported and documented."""

RESOLUTION_CHECKS: tuple[tuple[str, str], ...] = (
    (
        "overlap-owner-conflict",
        "`comm_overlap.<switch>` is set and a field it drives (e.g. `model.overlap_moe_expert_parallel_comm`) "
        "was set to a different value: error naming both fields and the layers that set them.",
    ),
    (
        "overlap-target-conflict",
        "`comm_overlap.<switch>` is unset and the fields it drives were set to different values "
        "(e.g. `model.delay_wgrad_compute` vs `ddp.delay_wgrad_compute`).",
    ),
)
"""Checks made while resolving ownership (not table rules: they compare layers, not values)."""


# --------------------------------------------------------------------------------------------
# Docs page, generated from the tables
# --------------------------------------------------------------------------------------------

DOCS_PATH = "docs/training/communication-overlap.md"

_DOC_HEADER = """\
# Communication overlap

<!-- Generated by `uv run python -m megatron.bridge.training.comm_overlap --write-docs` from the
tables in `src/megatron/bridge/training/comm_overlap.py`; a unit test fails when it is stale. -->

## Turning MoE expert-parallel overlap on

```python
cfg.comm_overlap.overlap_moe_expert_parallel_comm = True
cfg.comm_overlap.delay_wgrad_compute = True          # optional: delayed expert wgrad
cfg.model.moe_shared_expert_overlap = False          # must be off with dispatch overlap
```

or, on the harness command line, `comm_overlap.overlap_moe_expert_parallel_comm=true`
(`--moe_a2a_overlap true|false`). `cfg.validate()` (works on a machine without GPU) raises one
`CommOverlapConfigError` listing **every** unmet prerequisite with the field, its current value
and the fix. An explicit request that cannot be honoured is an error, never a silent downgrade;
rules with severity `warning` are logged and shown in the start-up overlap report.

Transformer Engine version rules are evaluated against the installed TE ("absent" when it does
not import). The delayed-wgrad TE version rules apply when TE is present. Without TE the layers are
torch-native (their grouped-GEMM experts defer the wgrad GEMMs for real) or, when requested, the
plain megatron-core `local` layers, where delayed wgrad is a harmless no-op and
`delay-wgrad-no-op-with-local-layers` warns (so a CPU login node can still dry-run a TE cluster's config), while features that cannot exist without
TE (`te-cuda-graph-needs-te`, `tp-overlap-needs-te`) are errors. Flex-dispatcher rules are evaluated against the target GPU: the harness's `-g` GPU
type (`cfg.dist.target_gpu`), else the visible GPU; on a CPU host without a target they are
reported as not checked.

## Switches, ownership and computed defaults

`cfg.comm_overlap` owns every switch. `null` means "framework decides"; the decision is made in one
place at every `finalize()`/`validate()` (so edits after a first `validate()` take effect) and
recorded as `computed` in `cfg.provenance` of the resolved copy. A value set directly on a driven
field is honoured while the owner is `null`; if the owner is set too and they differ, that is an
error.

| switch | applied to | when `null` |
|---|---|---|
"""


def _docs_fields_table() -> str:
    rows = []
    for spec in OVERLAP_FIELDS:
        targets = ", ".join(f"`{t}`" for t in spec.targets) or "(training start-up)"
        rows.append(f"| `comm_overlap.{spec.name}` | {targets} | {spec.rule_text} |")
    return "\n".join(rows) + "\n"


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _docs_rules_table() -> str:
    lines = [
        f"\n## Prerequisites ({len(OVERLAP_RULES)} rules)\n\n",
        "| id | group | severity | fields | rule | fix |\n|---|---|---|---|---|---|\n",
    ]
    type_rules = [r for r in OVERLAP_RULES if r.group == "types"]
    switches = ", ".join(f"`{r.fields[0]}`" for r in type_rules)
    lines.append(
        f"| `overlap-switch-is-bool:<switch>` ({len(type_rules)} rules) | types | error | {switches} | "
        f"{_escape(type_rules[0].message)} | set the switch to true, false or null |\n"
    )
    for rule in (r for r in OVERLAP_RULES if r.group != "types"):
        fields = ", ".join(f"`{f}`" for f in rule.fields + tuple(n for n, _ in rule.extra_values))
        lines.append(
            f"| `{rule.id}` | {rule.group} | {rule.severity} | {fields} | "
            f"{_escape(rule.message)} | {_escape(rule.fix)} |\n"
        )
    lines.append("\n## Ownership checks\n\n| id | when |\n|---|---|\n")
    lines += [f"| `{rid}` | {_escape(text)} |\n" for rid, text in RESOLUTION_CHECKS]
    return "".join(lines)


_DOC_FOOTER = """
## Where this table and megatron-core 0.19.2 differ

megatron-core re-checks the EP-overlap rules in `TransformerConfig.__post_init__` with bare
`assert`s; `tests/unit_tests/training/test_megatron_parity.py` shows it rejects every config our
EP-overlap/delay-wgrad rules reject (where it has the rule) and accepts one we accept.

- Ours only: `ep-overlap-needs-moe-experts` for `num_moe_experts=1` (megatron-core only requires
  `num_moe_experts` to be set for EP), the TE >= 2.7 and TE >= 2.12 delayed-wgrad rules of the
  SPEC (and the grad-accumulation-fusion and attention-bias parts of the latter), and the warnings
  `delay-wgrad-no-op-with-local-layers` (megatron-core's local linears implement `backward_dw` as a no-op) and
  `ep-overlap-needs-two-micro-batches`. `ep-overlap-needs-torch-2.6` is shared, but megatron-core
  reads the installed torch while we read the rule context.
- Taken from megatron-core (not in the SPEC): TE >= 2.10 for delayed wgrad with
  `cuda_graph_impl="transformer_engine"` (`delay-wgrad-te-cuda-graph-te-2.10`; megatron-core treats
  a missing TE as version 0, we report `te-cuda-graph-needs-te` instead) and
  `ep-overlap-excludes-dispatch-wgrad-overlap`.
- megatron-core only (still reported, as a typed `megatron-core-post-init` error, because finalize
  runs megatron-core's checks after ours): `ep_overlap_early_attn_memory_release` needing EP
  overlap, and the `ncclep` backend's extra checks.
- Stricter than megatron-core: an explicit `overlap_p2p_comm` without the interleaved schedule is
  rejected at validation (megatron-core raises only when the schedule runs); a flex backend set
  while the dispatcher is not flex (pitfall 3) is an error; the flex dispatcher needs an explicit
  backend (megatron-core silently defaults to `deepep`).
- Scopes: megatron-core 0.19.2 names capture regions `cuda_graph_modules` (the old
  `cuda_graph_scope` is deprecated and migrated); both are read here. An empty list (or the
  deprecated `"full"`) captures the whole layer, which we count as "attention inside the graph"
  for the delayed-wgrad TE >= 2.12 rule; the rule applies to both per-layer implementations
  (`local`, `transformer_engine`).

## CUDA_DEVICE_MAX_CONNECTIONS

EP overlap needs more than one hardware queue (32) so the all-to-all runs beside compute; TP/CP
communication overlap wants 1 on pre-Blackwell GPUs to keep kernel order. The start-up overlap
report (`megatron.bridge.training.overlap_report.build_overlap_report`) states the value the run
needs and reports the conflict when both apply.

## Flex dispatcher backends

Setting `model.moe_flex_dispatcher_backend` alone does not activate flex dispatch; use
`--moe_flex_dispatcher_backend deepep|hybridep|None` (or `apply_flex_dispatcher_backend`), which
sets the dispatcher to `flex`, the backend, and `moe_shared_expert_overlap=false` (`None` = plain
`alltoall`). An unsupported GPU is an error unless `fallback="alltoall"` is passed (then logged).

"""


def render_docs() -> str:
    """The docs page, from the tables."""
    from megatron.bridge.training.flex_dispatcher_backend import render_support_table

    return _DOC_HEADER + _docs_fields_table() + _docs_rules_table() + _DOC_FOOTER + render_support_table()


def _main(argv: Optional[list[str]] = None) -> int:
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help=f"regenerate {DOCS_PATH}")
    parser.add_argument("--root", default=".", help="repository root")
    args = parser.parse_args(argv)
    text = render_docs()
    if args.write_docs:
        path = Path(args.root) / DOCS_PATH
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
