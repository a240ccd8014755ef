"""The dispatch paths' rules (``models/dispatch/``), as the configuration checks them.

Each path declares its own rules; they are gathered here by kind, in registry order: the
torch-native and megatron paths' rules join the torch-native dispatch table (``dispatch_rules.py``),
the flex paths' the flex settings (``flex_rules.py``). A path's rules may ask what only this stage
knows (:class:`ConfigFacts`: the layer implementation, the precision, the target GPU).

Every optional module a path needs (a ``PackageNeed``) becomes two rules, once per module however
many paths need it: an error where the configured path needs it and it does not import on a GPU
host, a note on a CPU host (which cannot tell for the cluster). ``RuleContext.packages`` holds what
the host answered (``path_registry.probe_packages``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from megatron.bridge.models.dispatch.dispatch_path import DispatchPath, PackageNeed, PathKind
from megatron.bridge.models.dispatch.path_registry import DISPATCH_PATHS, configured_path, package_needs, paths_needing
from megatron.bridge.training.config_stages.facts.gpu_catalog import GpuTarget, gpu_target_from_context
from megatron.bridge.training.config_stages.facts.overlap_facts import (
    layers_use_te,
    precision_fp4,
    precision_fp8,
    resolved_layer_spec,
)
from megatron.bridge.training.config_stages.schema.rule_base import Rule, RuleContext


class ConfigFacts:
    """The answers a path's rules may ask this stage for (``dispatch_path.RunFacts``)."""

    def layers_use_te(self, cfg: Any, ctx: RuleContext) -> bool:
        return layers_use_te(cfg, ctx)

    def uses_torch_native_layers(self, cfg: Any, ctx: RuleContext) -> bool:
        return resolved_layer_spec(cfg, ctx) == "torch_native"

    def low_precision(self, cfg: Any) -> bool:
        return bool(precision_fp8(cfg) or precision_fp4(cfg))

    def target_gpu(self, ctx: RuleContext) -> GpuTarget:
        return gpu_target_from_context(ctx)


CONFIG_FACTS = ConfigFacts()


def rules_of(kinds: tuple[PathKind, ...], paths: tuple[DispatchPath, ...] | None = None) -> tuple[Rule, ...]:
    """The rules of the paths of ``kinds`` (default: the registry's paths), in registry order."""
    return tuple(
        rule for p in (DISPATCH_PATHS if paths is None else paths) if p.kind in kinds for rule in p.rules(CONFIG_FACTS)
    )


def available_text(available: bool | None) -> str:
    return {True: "importable", False: "not importable", None: "unknown"}[available]


def host_text(ctx: RuleContext) -> str:
    return "GPU host" if ctx.cuda_available else "CPU host (dry run)"


def _configured_needs(need: PackageNeed) -> Callable[[Any, RuleContext], bool]:
    """Predicate: the config asks for a path that needs ``need`` (its megatron-core dispatcher, or its
    ``model.torch_native_dispatcher`` value)."""
    needing = paths_needing(need)
    asked = {p.torch_native_value for p in needing if p.torch_native_value}
    return lambda cfg, ctx: (
        configured_path(cfg.model) in needing
        or (bool(asked) and getattr(cfg.model, "torch_native_dispatcher", None) in asked)
    )


def _for_flex(need: PackageNeed) -> bool:
    return any(p.kind == "flex" for p in paths_needing(need))


def package_rules(need: PackageNeed) -> tuple[Rule, Rule]:
    """The error on a GPU host and the note on a CPU host for one optional module (group
    ``flex-dispatcher`` where a flex backend needs it, as ``apply_``/``validate_flex_dispatcher_backend``
    check those)."""
    configured = _configured_needs(need)
    shown = ((need.module, lambda ctx: available_text(ctx.package(need.module))), ("host", host_text))
    flex = _for_flex(need)
    group = "flex-dispatcher" if flex else "torch-native-dispatch"
    fields = (
        ("model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend")
        if flex
        else ("model.torch_native_dispatcher",)
    )
    return (
        Rule(
            id=need.rule_id,
            group=group,
            fields=fields,
            applies=lambda cfg, ctx: configured(cfg, ctx) and bool(ctx.cuda_available),
            holds=lambda cfg, ctx: ctx.package(need.module) is not False,
            message=need.message,
            fix=need.fix,
            extra_values=shown,
        ),
        Rule(
            id=need.note_id,
            group=group,
            severity="warning",
            fields=fields,
            applies=lambda cfg, ctx: configured(cfg, ctx) and not ctx.cuda_available,
            holds=lambda cfg, ctx: ctx.package(need.module) is not False,
            message=need.note_message,
            fix=need.note_fix,
            extra_values=shown,
        ),
    )


TORCH_NATIVE_PATH_RULES: tuple[Rule, ...] = rules_of(("torch_native", "megatron")) + tuple(
    rule for need in package_needs() if not _for_flex(need) for rule in package_rules(need)
)
"""The torch-native and megatron dispatch paths' own rules, then those of the packages only they need."""
FLEX_PATH_RULES: tuple[Rule, ...] = rules_of(("flex",))
"""The flex backends' own rules (their settings)."""
FLEX_PACKAGE_RULES: tuple[Rule, ...] = tuple(
    rule for need in package_needs() if _for_flex(need) for rule in package_rules(need)
)
"""The flex backends' package rules (``deep_ep``, Transformer Engine's NCCL EP module)."""
