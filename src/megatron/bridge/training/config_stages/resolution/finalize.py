"""Resolve a user's ``ConfigContainer`` once, in a fixed order, into everything a run needs.

:func:`resolve_config` returns one :class:`Resolution`: the effective configuration (precision
flags and overlap switches decided, copies written, provenance recorded), each overlap switch with
its source, every violation and warning, the start-up overlap report and the finalized config that
trains. The harness (dry-run table, saved YAML, launch), the start-up report and ``pretrain`` all
read it, so they cannot disagree and nothing is resolved twice.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from packaging.version import Version

from megatron.bridge.models.dispatch.path_registry import probe_packages
from megatron.bridge.models.layer_specs import LayerSpecChoice
from megatron.bridge.training.config_stages.facts import gpu_catalog, ownership
from megatron.bridge.training.config_stages.facts.overlap_facts import layer_spec_choice
from megatron.bridge.training.config_stages.resolution import overlap_resolution
from megatron.bridge.training.config_stages.resolution.mixed_precision_resolution import apply_mixed_precision
from megatron.bridge.training.config_stages.resolution.overlap_report import OverlapReport, report_from
from megatron.bridge.training.config_stages.resolution.overlap_resolution import EffectiveValue
from megatron.bridge.training.config_stages.rules.overlap_rules import OVERLAP_RULES
from megatron.bridge.training.config_stages.rules.registry import ALL_RULES
from megatron.bridge.training.config_stages.schema.rule_base import RuleContext, check_rules, field_default
from megatron.bridge.training.errors import CommOverlapConfigError, ConfigValidationError, Violation
from megatron.bridge.training.tokenizers.config import derive_vocab_size
from megatron.bridge.utils.host import current_host

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

logger = logging.getLogger(__name__)

_OVERLAP_RULE_IDS = frozenset(r.id for r in OVERLAP_RULES)


def world_size_or_environment(world_size: int | None) -> int | None:
    """``world_size``, else ``$WORLD_SIZE`` when set, else ``None`` (checks needing it are skipped)."""
    if world_size is None and os.environ.get("WORLD_SIZE"):
        return int(os.environ["WORLD_SIZE"])
    return world_size


def world_size_violation(world_size: object) -> Violation | None:
    """``world_size`` (the ranks the run will have) must be a whole number >= 1, or ``None``
    (unknown: the checks that need it are skipped)."""
    if world_size is None or (isinstance(world_size, int) and not isinstance(world_size, bool) and world_size >= 1):
        return None
    return Violation(
        "world-size-positive",
        ("world_size",),
        (world_size,),
        "world_size counts the ranks of the run: a whole number of at least 1",
        "pass e.g. cfg.validate(world_size=16) (an int), or leave it out to check what does not depend on it",
        value_label="given",
    )


def default_rule_context(world_size: int | None = None, target_gpu: str | None = None, **overrides) -> RuleContext:
    """Facts about the machine (``current_host()``: its GPU, Transformer Engine, the packages the dispatch
    paths need); ``world_size`` falls back to ``$WORLD_SIZE`` when set.

    The target GPU is ``target_gpu`` (a ``-g`` type such as ``h100``/``gb200``), else the visible
    GPU, else unknown (a CPU host validates what it can and says so).
    """
    world_size = world_size_or_environment(world_size)
    host = current_host()
    visible_capability, _ = host.gpu()
    target = gpu_catalog.resolve_gpu_target(device_name=target_gpu) if target_gpu else gpu_catalog.resolve_gpu_target()
    facts: dict[str, Any] = dict(
        te_version=host.te_version(),
        torch_version=Version(torch.__version__.split("+")[0]),
        world_size=world_size,
        device_capability=target.capability,
        device_name=target.name,
        cuda_available=visible_capability is not None,
        packages=probe_packages(host),
    )
    facts.update(overrides)
    return RuleContext(**facts)


@dataclass(frozen=True)
class Resolution:
    """One resolution of a user's config: what every consumer of the run reads."""

    effective: ConfigContainer
    """The user's config with every derived value decided and written (precision flags, overlap
    switches on their owners and copies), provenance recorded; serialisable (the saved YAML)."""
    values: dict[str, EffectiveValue]
    """Each overlap switch: value, the layer that set it, why."""
    errors: tuple[Violation, ...]
    warnings: tuple[Violation, ...]
    report: OverlapReport
    context: RuleContext
    layer_spec: LayerSpecChoice
    """The layer implementation the run builds (``model.layer_spec=auto`` decided) and why."""
    config: ConfigContainer | None
    """``effective`` after megatron-core's own deferred checks, with ``model.layer_spec`` holding the
    choice: what trains (``None`` with errors)."""

    @property
    def trained(self) -> ConfigContainer:
        """:attr:`config` of a resolution without errors; one with errors has nothing to train."""
        if self.config is None:
            raise ValueError("a resolution with errors has no config to train: raise_for_errors() says which")
        return self.config

    @property
    def error_type(self) -> type:
        """``CommOverlapConfigError`` when an overlap rule or a copy of an overlap switch is involved."""
        overlap = any(v.rule in _OVERLAP_RULE_IDS or ownership.concerns_overlap(v) for v in self.errors)
        return CommOverlapConfigError if overlap else ConfigValidationError

    def raise_for_errors(self) -> Resolution:
        """Raise the typed error listing every problem; return ``self`` when there is none."""
        if self.errors:
            raise self.error_type(list(self.errors))
        return self


def _effective_config(cfg: ConfigContainer, ctx: RuleContext) -> tuple[ConfigContainer, dict, list[Violation]]:
    """A private copy with every derived value written, the overlap values, and the copies a user
    wrote directly that disagree with them."""
    written = ownership.directly_written(cfg)
    work = copy.deepcopy(cfg)
    if work.comm_overlap is None:  # an old recipe or YAML: every switch unset
        work.comm_overlap = field_default(work, "comm_overlap")  # the container's own default section
    derive_vocab_size(work)  # model.vocab_size unset: the NullTokenizer's vocabulary
    ownership.write_following_copies(work)  # dataset.seq_length: model.seq_length
    values = overlap_resolution.resolve_overlap_values(work, ctx)
    apply_mixed_precision(work)
    overlap_resolution.apply_overlap_values(work, values)
    ownership.remember_copies(work)
    return work, values, ownership.direct_write_violations(written, work)


def resolve_config(cfg: ConfigContainer, world_size: int | None = None, ctx: RuleContext | None = None) -> Resolution:
    """Resolve ``cfg`` (not changed) for the machine ``ctx`` describes; never raises for a rule.

    Order: precision flags and overlap switches, then every rule at once, then megatron-core's own
    deferred ``__post_init__`` (only when our rules pass; its complaints become a violation).
    """
    world_problem = world_size_violation(world_size)
    if world_problem is not None:
        world_size = None  # checked as unknown: its own problem is listed with the others
    ctx = ctx or default_rule_context(world_size, target_gpu=getattr(cfg.dist, "target_gpu", None))
    effective, values, violations = _effective_config(cfg, ctx)
    violations += [world_problem] if world_problem else []
    violations += check_rules(ALL_RULES, effective, ctx)
    warnings = [v for v in violations if v.severity != "error"]
    for warning in warnings:
        logger.warning("config: %s", warning.format())
    errors = [v for v in violations if v.severity == "error"]
    layer_spec = layer_spec_choice(effective, ctx)
    config = None
    if not errors:
        config = copy.deepcopy(effective)
        config.model.layer_spec = layer_spec.name
        post_init_problem = run_megatron_post_init(config)
        if post_init_problem is not None:
            errors, config = [post_init_problem], None
    return Resolution(
        effective=effective,
        values=values,
        errors=tuple(errors),
        warnings=tuple(warnings),
        report=report_from(effective, values, violations, ctx, layer_spec),
        context=ctx,
        layer_spec=layer_spec,
        config=config,
    )


@dataclass(frozen=True)
class _LastResolution:
    """The last resolution of one user container, and the container as it stood afterwards."""

    container: weakref.ref
    world_size: int | None
    as_left: ConfigContainer
    resolution: Resolution
    trains: ConfigContainer
    """A pristine copy of ``resolution.config`` (a run changes the config it is handed)."""

    def answers(self, cfg: ConfigContainer, world_size: int | None) -> bool:
        if self.container() is not cfg or self.world_size != world_size:
            return False
        try:
            return bool(self.as_left == cfg)
        except Exception:  # a field whose values cannot be compared: resolve again
            return False


_LAST_RESOLUTION: dict[int, _LastResolution] = {}


def resolve_container(cfg: ConfigContainer, world_size: int | None = None) -> Resolution:
    """``cfg.resolve()``: resolve the user's ``cfg``, raise the typed error listing every problem, and
    write the effective values into its copies (owners untouched).

    One resolution per process: asked again for a container unchanged since its last resolution
    (``validate()`` in a script, then ``pretrain()``), the same resolution is returned, with a fresh
    copy of the config that trains.
    """
    world_size = world_size_or_environment(world_size)
    last = _LAST_RESOLUTION.get(id(cfg))
    if last is not None and last.answers(cfg, world_size):
        return dataclasses.replace(last.resolution, config=copy.deepcopy(last.trains))
    resolution = resolve_config(cfg, world_size=world_size).raise_for_errors()
    ownership.write_copies(cfg, resolution.effective)
    key = id(cfg)
    _LAST_RESOLUTION[key] = _LastResolution(
        container=weakref.ref(cfg, lambda _ref: _LAST_RESOLUTION.pop(key, None)),
        world_size=world_size,
        as_left=copy.deepcopy(cfg),
        resolution=resolution,
        trains=copy.deepcopy(resolution.trained),
    )
    return resolution


def run_megatron_post_init(cfg: ConfigContainer) -> Violation | None:
    """Run megatron-core's deferred checks on ``cfg``; its bare ``assert``s become a violation."""
    try:
        cfg.model.finalize()
    except (AssertionError, ValueError) as exc:
        return Violation(
            rule="megatron-core-post-init",
            fields=("model",),
            values=(type(cfg.model).__name__,),
            message=f"megatron-core rejected the model config: {exc}",
            fix="change the model fields named in the message",
        )
    return None
