"""Start-up overlap report: which overlap features are active, which were refused and why.

Every resolution (``finalize.resolve_config``) carries one report. The training start-up logs
``report.format()``, so that a clean start-up confirms the feature is on, and sets
``CUDA_DEVICE_MAX_CONNECTIONS`` from ``report.cuda_device_max_connections`` before CUDA
initialises. ``--dryrun`` prints the same report on a CPU host; a report on a config that does not
validate lists the refused features and why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from megatron.bridge.models.dispatch.path_registry import describe_dispatcher
from megatron.bridge.training.config_stages.facts.gpu_catalog import gpu_target_from_context
from megatron.bridge.training.config_stages.facts.ownership import OWNERSHIP_RULE_IDS, concerns_overlap
from megatron.bridge.training.config_stages.facts.parallel_layout import positive_size
from megatron.bridge.training.config_stages.resolution.overlap_resolution import EffectiveValue
from megatron.bridge.training.config_stages.rules.overlap_rules import NO_EFFECT_RULE_IDS, OVERLAP_RULES
from megatron.bridge.training.config_stages.schema.rule_base import RuleContext, read_field, te_version_text
from megatron.bridge.training.errors import Violation

if TYPE_CHECKING:
    from megatron.bridge.models.layer_specs import LayerSpecChoice
    from megatron.bridge.training.config import ConfigContainer

EP_OVERLAP_MAX_CONNECTIONS = 32
"""Hardware queues EP overlap asks for so the all-to-all runs beside compute."""

_GROUP_OF = {rule.id: rule.group for rule in OVERLAP_RULES}

HEADING = "overlap report:"
"""The first line of :meth:`OverlapReport.format` (left out with ``heading=False``)."""


@dataclass(frozen=True)
class FeatureSpec:
    """A reportable feature: the field that turns it on and the rule groups that can refuse it."""

    name: str
    switch: str
    groups: tuple[str, ...]
    depends_on: str | None = None


FEATURES: tuple[FeatureSpec, ...] = (
    FeatureSpec("moe_ep_overlap", "comm_overlap.overlap_moe_expert_parallel_comm", ("ep-overlap",)),
    FeatureSpec("delay_wgrad", "comm_overlap.delay_wgrad_compute", ("delay-wgrad",), "moe_ep_overlap"),
    FeatureSpec("tp_comm_overlap", "comm_overlap.tp_comm_overlap", ("tp-overlap",)),
    FeatureSpec("p2p_overlap", "comm_overlap.overlap_p2p_comm", ("pipeline",)),
    FeatureSpec("batch_p2p", "comm_overlap.batch_p2p_comm", ("pipeline",)),
    FeatureSpec("grad_reduce_overlap", "comm_overlap.overlap_grad_reduce", ("data-parallel",)),
    FeatureSpec("param_gather_overlap", "comm_overlap.overlap_param_gather", ("data-parallel",)),
    FeatureSpec("shared_expert_overlap", "model.moe_shared_expert_overlap", ("shared-expert",)),
    FeatureSpec("flex_dispatcher", "model.moe_token_dispatcher_type", ("flex-dispatcher", "flex-settings")),
    FeatureSpec(
        "ep_early_attn_release", "model.ep_overlap_early_attn_memory_release", ("ep-early-release",), "moe_ep_overlap"
    ),
    FeatureSpec("dispatch_wgrad_overlap", "model.overlap_dispatch_backward_with_experts_wgrad", ("dispatch-wgrad",)),
    FeatureSpec("activation_offload", "model.fine_grained_activation_offloading", ("activation-offload",)),
    FeatureSpec("paged_stash", "model.moe_paged_stash", ("paged-stash",)),
)


@dataclass(frozen=True)
class FeatureState:
    """One feature: requested (effective switch on), active (on and nothing refuses it), why."""

    name: str
    switch: str
    requested: bool
    active: bool
    source: str
    reasons: tuple[str, ...] = ()
    """Why it was refused (errors), why it does nothing, or what to know (notes)."""
    no_effect: bool = False
    """Requested and accepted, but a warning says it does nothing here (e.g. shared-expert overlap
    on a model without a shared expert): not active."""

    @property
    def refused(self) -> bool:
        """Requested but cannot run."""
        return self.requested and not self.active and not self.no_effect


@dataclass(frozen=True)
class OverlapReport:
    """Structured start-up report; ``format()`` for the log, ``to_dict()`` for JSON."""

    features: tuple[FeatureState, ...]
    dispatcher: str
    flex_backend: str | None
    target_gpu: str
    layer_spec: str
    """The layer implementation the run builds (``auto`` decided)."""
    layer_spec_reason: str
    """Why: ``requested``, or the ``auto`` rule that chose it."""
    transformer_engine: str
    cuda_device_max_connections: int | None
    """Value the run needs; ``None``: no requirement (CUDA's default applies)."""
    cuda_device_max_connections_reason: str
    cuda_device_max_connections_conflict: str | None
    cuda_device_max_connections_env: str | None
    effective: dict[str, EffectiveValue] = field(default_factory=dict)
    errors: tuple[Violation, ...] = ()
    notes: tuple[Violation, ...] = ()
    dispatcher_path: str = ""
    """Which dispatch path runs, with the flex backend's settings (``describe_dispatcher``)."""

    @property
    def active(self) -> list[str]:
        """Names of the active features."""
        return [f.name for f in self.features if f.active]

    @property
    def refused(self) -> list[FeatureState]:
        """Features requested but refused."""
        return [f for f in self.features if f.refused]

    @property
    def no_effect(self) -> list[FeatureState]:
        """Features requested and accepted that do nothing in this run (a warning says why)."""
        return [f for f in self.features if f.no_effect]

    @property
    def cuda_device_max_connections_env_mismatch(self) -> bool:
        """The environment already sets a different value than the run needs."""
        env, need = self.cuda_device_max_connections_env, self.cuda_device_max_connections
        return env is not None and need is not None and env.strip() != str(need)

    def feature(self, name: str) -> FeatureState:
        """The state of one feature by name."""
        return next(f for f in self.features if f.name == name)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {
            "active": self.active,
            "refused": {f.name: list(f.reasons) for f in self.refused},
            "no_effect": {f.name: list(f.reasons) for f in self.no_effect},
            "features": {
                f.name: {
                    "switch": f.switch,
                    "requested": f.requested,
                    "active": f.active,
                    "no_effect": f.no_effect,
                    "source": f.source,
                    "reasons": list(f.reasons),
                }
                for f in self.features
            },
            "dispatcher": self.dispatcher,
            "flex_backend": self.flex_backend,
            "dispatcher_path": self.dispatcher_path,
            "target_gpu": self.target_gpu,
            "layer_spec": self.layer_spec,
            "layer_spec_reason": self.layer_spec_reason,
            "transformer_engine": self.transformer_engine,
            "cuda_device_max_connections": self.cuda_device_max_connections,
            "cuda_device_max_connections_reason": self.cuda_device_max_connections_reason,
            "cuda_device_max_connections_conflict": self.cuda_device_max_connections_conflict,
            "cuda_device_max_connections_env": self.cuda_device_max_connections_env,
            "cuda_device_max_connections_env_mismatch": self.cuda_device_max_connections_env_mismatch,
            "effective": {v.key: {"value": _jsonable(v.value), "source": v.source} for v in self.effective.values()},
            "errors": [v.rule for v in self.errors],
            "notes": [v.rule for v in self.notes],
        }

    @property
    def layer_spec_line(self) -> str:
        """The start-up line naming the layer implementation and why it was chosen."""
        return f"layer spec: {self.layer_spec} ({self.layer_spec_reason})"

    def format(self, brief: bool = False, heading: bool = True) -> str:
        """Multi-line text for the start-up log; ``brief`` leaves out the lines that only restate
        the dispatcher, target GPU, layer spec and ``CUDA_DEVICE_MAX_CONNECTIONS`` (the start-up
        lines show those), keeping what is active, refused, without effect, noted or in conflict.
        ``heading=False`` leaves out the first line (``overlap report:``), for a caller that
        prints its own heading."""
        lines = [HEADING] if heading else []
        lines.append(f"  active: {', '.join(self.active) or 'none'}")
        for f in self.refused:
            lines.append(f"  REFUSED {f.name} ({f.switch}, set by {f.source}):")
            lines += [f"    - {r}" for r in f.reasons]
        for f in self.no_effect:
            lines.append(f"  WARNING: {f.name} has no effect ({f.switch}, set by {f.source}):")
            lines += [f"    - {r}" for r in f.reasons]
        for f in self.features:
            if f.active and f.reasons:
                lines.append(f"  note on {f.name}:")
                lines += [f"    - {r}" for r in f.reasons]
        if not brief:
            lines += self._setting_lines()
        if self.cuda_device_max_connections_env_mismatch:
            lines.append(
                f"  WARNING: CUDA_DEVICE_MAX_CONNECTIONS={self.cuda_device_max_connections_env} in the "
                f"environment, the run needs {self.cuda_device_max_connections}"
            )
        if self.cuda_device_max_connections_conflict:
            lines.append(f"  CONFLICT: {self.cuda_device_max_connections_conflict}")
        shown = [r for f in self.features for r in f.reasons]
        for v in self.errors:
            if not any(v.message in r for r in shown):
                lines.append(f"  error: {v.format()}")
        for v in self.notes:
            if not any(v.message in r for r in shown):
                lines.append(f"  note: [{v.rule}] {v.message}")
        return "\n".join(lines)

    def _setting_lines(self) -> list[str]:
        backend = f", backend {self.flex_backend}" if self.flex_backend else ""
        path = self.dispatcher_path or f"{self.dispatcher}{backend}"
        need = self.cuda_device_max_connections
        te = f"Transformer Engine {self.transformer_engine}"
        te_suffix = "" if te in self.layer_spec_line else f"; {te}"  # the reason may say it already
        return [
            f"  dispatcher: {path}",
            f"  target GPU: {self.target_gpu}",
            f"  {self.layer_spec_line}{te_suffix}",
            f"  CUDA_DEVICE_MAX_CONNECTIONS: {'no requirement' if need is None else need} "
            f"({self.cuda_device_max_connections_reason}); environment: "
            f"{self.cuda_device_max_connections_env or 'unset'}",
        ]


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float, str, type(None))) else repr(value)


def _requested(cfg: ConfigContainer, spec: FeatureSpec) -> bool:
    if spec.name == "flex_dispatcher":  # a backend without the flex dispatcher is a (refused) request too
        return cfg.model.moe_token_dispatcher_type == "flex" or cfg.model.moe_flex_dispatcher_backend is not None
    return bool(read_field(cfg, spec.switch))


def _belongs(v: Violation, spec: FeatureSpec) -> bool:
    return _GROUP_OF.get(v.rule) in spec.groups or (
        (v.rule.startswith("overlap-") or v.rule in OWNERSHIP_RULE_IDS) and spec.switch in v.fields
    )


def _feature_states(
    cfg: ConfigContainer, effective: dict[str, EffectiveValue], violations: list[Violation]
) -> tuple[FeatureState, ...]:
    states: dict[str, FeatureState] = {}
    for spec in FEATURES:
        requested = _requested(cfg, spec)
        mine = [v for v in violations if _belongs(v, spec)] if requested else []
        errors = [v for v in mine if v.severity == "error"]
        reasons = [f"{v.message} -> fix: {v.fix}" for v in errors]
        parent = states.get(spec.depends_on) if spec.depends_on else None
        if parent is not None and parent.refused and requested:
            reasons.append(f"needs {parent.name}, which was refused")
        warnings = [v for v in mine if v.severity != "error"]
        idle = [f"{v.message} -> fix: {v.fix}" for v in warnings if v.rule in NO_EFFECT_RULE_IDS]
        notes = [f"{v.message}" for v in warnings if v.rule not in NO_EFFECT_RULE_IDS]
        no_effect = requested and not reasons and bool(idle)
        key = spec.switch.removeprefix("comm_overlap.")
        source = (
            effective[key].source if key in effective else getattr(cfg, "provenance", {}).get(spec.switch, "recipe")
        )
        states[spec.name] = FeatureState(
            spec.name,
            spec.switch,
            requested,
            requested and not reasons and not idle,
            source,
            tuple(reasons + idle + notes),
            no_effect,
        )
    return tuple(states.values())


def _max_connections(
    cfg: ConfigContainer, ctx: RuleContext, ep_active: bool, tp_overlap_active: bool
) -> tuple[int | None, str, str | None]:
    """Value the run needs, why, and the conflict between EP overlap and TP/CP comm ordering."""
    target = gpu_target_from_context(ctx)
    m = cfg.model
    tp_cp_comm = tp_overlap_active or any(
        (positive_size(size) or 1) > 1 for size in (m.tensor_model_parallel_size, m.context_parallel_size)
    )
    pre_blackwell = target.capability is None or target.capability[0] < 10
    arch = "unknown GPU, assumed pre-Blackwell" if target.capability is None else target.architecture
    wants_one = tp_cp_comm and pre_blackwell
    one_why = (
        f"TP/CP communication overlap (TP={m.tensor_model_parallel_size}, CP={m.context_parallel_size}) "
        f"wants 1 on pre-Blackwell GPUs ({arch}) to keep kernel order"
    )
    if ep_active and wants_one:
        conflict = (
            f"EP overlap needs > 1 ({EP_OVERLAP_MAX_CONNECTIONS}) to run the all-to-all beside compute, "
            f"but {one_why}; using {EP_OVERLAP_MAX_CONNECTIONS}: EP overlap works, TP/CP comm overlap "
            "may lose its ordering (compare step times with and without EP overlap)"
        )
        return EP_OVERLAP_MAX_CONNECTIONS, "EP overlap (conflict, see below)", conflict
    if ep_active:
        return EP_OVERLAP_MAX_CONNECTIONS, "EP overlap runs comm and compute concurrently (> 1)", None
    if wants_one:
        return 1, one_why, None
    return None, "no overlap feature constrains it", None


def _target_text(cfg: ConfigContainer, ctx: RuleContext) -> str:
    """The target line: the GPU the run is validated for, or CPU smoke mode (``-g cpu``)."""
    target = gpu_target_from_context(ctx)
    if getattr(cfg.dist, "device", "cuda") != "cpu":
        return target.describe()
    if not target.known:
        return "CPU smoke mode (-g cpu): no GPU target, GPU-specific checks do not apply"
    return f"CPU smoke mode (-g cpu); GPU rules checked for {target.describe()}"


def report_from(
    cfg: ConfigContainer,
    effective: dict[str, EffectiveValue],
    violations: list[Violation],
    ctx: RuleContext,
    layer_spec: LayerSpecChoice,
) -> OverlapReport:
    """The report on a resolved ``cfg`` (``finalize.resolve_config`` builds it once per resolution):
    ``effective`` are its overlap values, ``violations`` everything its rules found, ``layer_spec``
    the resolution's choice of layers."""
    violations = [v for v in violations if v.rule in _GROUP_OF or concerns_overlap(v)]
    features = _feature_states(cfg, effective, violations)
    states = {f.name: f for f in features}
    need, why, conflict = _max_connections(cfg, ctx, states["moe_ep_overlap"].active, states["tp_comm_overlap"].active)
    dispatcher = cfg.model.moe_token_dispatcher_type
    return OverlapReport(
        features=features,
        dispatcher=dispatcher,
        flex_backend=cfg.model.moe_flex_dispatcher_backend if dispatcher == "flex" else None,
        dispatcher_path=describe_dispatcher(cfg.model),
        target_gpu=_target_text(cfg, ctx),
        layer_spec=layer_spec.name,
        layer_spec_reason=layer_spec.reason,
        transformer_engine=te_version_text(ctx),
        cuda_device_max_connections=need,
        cuda_device_max_connections_reason=why,
        cuda_device_max_connections_conflict=conflict,
        cuda_device_max_connections_env=os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
        effective=effective,
        errors=tuple(v for v in violations if v.severity == "error"),
        notes=tuple(v for v in violations if v.severity != "error"),
    )
