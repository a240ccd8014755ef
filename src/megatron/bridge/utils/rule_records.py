"""Rules as data: one record per prerequisite, consumed by the validator, the docs and the tests.

A rule names the dotted fields it reads, when it applies, what must hold, the message and the fix.
Rules read a ``RuleContext`` for facts that are not in the config (installed TE version, the target
GPU, the world size, which optional packages import), so a CPU login node can validate against the
cluster's GPUs.

Defined below every other layer (as the error types are) so that a component below the
configuration, such as a dispatch path (``models/dispatch/``), declares its own rules; the
configuration's stages import them from ``training/config_stages/schema/rule_base.py``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from packaging.version import Version

from megatron.bridge.utils.error_types import Severity, Violation

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer


@dataclass(frozen=True)
class RuleContext:
    """Facts about the target machine and software that rules may read."""

    te_version: Version | None = None
    """Installed Transformer Engine version; ``None`` means absent."""
    torch_version: Version | None = None
    world_size: int | None = None
    device_capability: tuple[int, int] | None = None
    """Compute capability of the *target* GPU (``-g`` type, else the visible GPU); ``None``: unknown."""
    device_name: str | None = None
    """Target GPU type or device name (``h100``, ``NVIDIA GB200``); tells B200 from GB200 NVL72."""
    cuda_available: bool = False
    """Whether this process runs on a GPU machine (``False`` on a CPU host: a dry run)."""
    packages: Mapping[str, bool] = field(default_factory=dict, hash=False)
    """Optional module -> whether it imports here (``deep_ep``, ``transformer_engine.pytorch.ep``):
    the packages the dispatch paths need (``models/dispatch/``), probed on the host. A module not
    listed was not checked (:meth:`package`)."""

    def package(self, module: str) -> bool | None:
        """Whether ``module`` imports here; ``None``: not checked."""
        return self.packages.get(module)


def te_version_text(ctx: RuleContext) -> str:
    """The installed Transformer Engine version as rules and reports show it (``absent`` if none)."""
    return "absent" if ctx.te_version is None else str(ctx.te_version)


TE_VERSION_VALUE: tuple[tuple[str, Callable[[RuleContext], Any]], ...] = (("transformer_engine", te_version_text),)
"""``Rule.extra_values`` entry showing the TE version beside a rule's fields."""


def read_field(cfg: Any, dotted: str) -> Any:
    """Value at a dotted path such as ``model.num_moe_experts``."""
    return functools.reduce(getattr, dotted.split("."), cfg)


def field_default(cfg: Any, dotted: str) -> Any:
    """The dataclass default of the field at ``dotted`` (the holder's own class, so a subclass's
    preset counts); ``dataclasses.MISSING`` when the field has none."""
    holder_path, _, name = dotted.rpartition(".")
    holder = read_field(cfg, holder_path) if holder_path else cfg
    for f in dataclasses.fields(holder):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    return dataclasses.MISSING


@dataclass(frozen=True)
class Rule:
    """A prerequisite. ``holds`` is evaluated only where ``applies`` is true."""

    id: str
    fields: tuple[str, ...]
    holds: Callable[[ConfigContainer, RuleContext], bool]
    message: str
    fix: str
    applies: Callable[[ConfigContainer, RuleContext], bool] = lambda cfg, ctx: True
    severity: Severity = "error"
    group: str = "general"
    extra_values: tuple[tuple[str, Callable[[RuleContext], Any]], ...] = field(default=())
    """Non-config facts shown beside the field values (e.g. ``("transformer_engine", ...)``)."""
    derived_values: tuple[tuple[str, Callable[[ConfigContainer, RuleContext], Any]], ...] = field(default=())
    """Values computed from the config and the facts (e.g. the micro-batch count, a saved layout)."""

    def check(self, cfg: ConfigContainer, ctx: RuleContext) -> Violation | None:
        """The violation of this rule by ``cfg``, or ``None``."""
        if not self.applies(cfg, ctx) or self.holds(cfg, ctx):
            return None
        names = self.fields + tuple(name for name, _ in self.extra_values + self.derived_values)
        values = (
            tuple(read_field(cfg, f) for f in self.fields)
            + tuple(getter(ctx) for _, getter in self.extra_values)
            + tuple(getter(cfg, ctx) for _, getter in self.derived_values)
        )
        return Violation(self.id, names, values, self.message, self.fix, self.severity)


RANGE_PREFIX = "range:"
"""Rule ids of the numeric ranges (``field_ranges.py``): a value of the wrong type or out of range."""
_BAD_VALUE_ERRORS = (TypeError, ValueError, ArithmeticError)


def check_rules(rules: Iterable[Rule], cfg: ConfigContainer, ctx: RuleContext) -> list[Violation]:
    """Every violation of ``rules`` by ``cfg`` (never stops at the first).

    A rule that cannot even be evaluated (it compares or divides a value that is text, zero or
    negative) is left out when a range rule among ``rules`` already reports such a value: the user
    sees that value's problem once, with its range, instead of a crash. Otherwise its error is raised
    (a rule that fails on valid values is a bug to see)."""
    found, failed = [], []
    for rule in rules:
        try:
            violation = rule.check(cfg, ctx)
        except _BAD_VALUE_ERRORS as exc:
            failed.append(exc)
            continue
        if violation is not None:
            found.append(violation)
    if failed and not any(v.rule.startswith(RANGE_PREFIX) for v in found):
        raise failed[0]
    return found
