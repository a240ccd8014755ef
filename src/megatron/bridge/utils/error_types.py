"""Typed configuration errors. Every error lists *all* violations found, each with its fix.

The hierarchy, and what to catch::

    ConfigError (a ValueError)             every configuration problem found before work starts
    +-- ConfigValidationError              every failure of cfg.validate() / finalize() / resolve()
    |   +-- CommOverlapConfigError         ... where an overlap prerequisite is among the problems
    |       +-- FlexDispatcherBackendError ... where the flex dispatcher backend is
    +-- OverrideError (OverridesError)     a YAML file or dotted override that cannot be applied
    +-- UnknownFieldError                  an attribute a config dataclass does not have
    +-- ArgumentError (a TypeError)        an argument pretrain() or a recipe cannot take here

Catch ``ConfigValidationError`` for any validation failure (a layout, batch or range rule as well
as an overlap prerequisite); ``CommOverlapConfigError`` only catches the failures that involve an
overlap prerequisite. ``ConfigError`` catches all of the above.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Severity = Literal["error", "warning"]


def did_you_mean(name: str, choices: Iterable[str], prefix: str = "") -> str | None:
    """The fix for a misspelt ``name``: ``did you mean <prefix>a or <prefix>b?`` with up to three of
    ``choices`` spelt like it, or ``None`` when none is close (the caller then says what else to do).
    One wording for every unknown-name error: config attributes, dotted overrides, Hydra overrides."""
    close = difflib.get_close_matches(name, list(choices), n=3, cutoff=0.6)
    return "did you mean " + " or ".join(prefix + c for c in close) + "?" if close else None


@dataclass(frozen=True)
class Violation:
    """One broken rule: which fields, their current values, what is wrong and how to fix it."""

    rule: str
    fields: tuple[str, ...]
    values: tuple[Any, ...]
    message: str
    fix: str
    severity: Severity = "error"
    value_label: str = "current"
    """How the values are introduced: ``current`` for config values, ``given`` for raw input."""

    def format(self) -> str:
        """Human-readable, one violation per paragraph."""
        current = ", ".join(f"{f}={v!r}" for f, v in zip(self.fields, self.values))
        return f"[{self.rule}] {self.message}\n    {self.value_label}: {current}\n    fix: {self.fix}"


class ConfigError(ValueError):
    """Base of every configuration error raised before any expensive work starts."""

    def __init__(self, violations: Sequence[Violation], title: str = "invalid configuration") -> None:
        self.violations: list[Violation] = list(violations)
        body = "\n".join(f"  {i}. {v.format()}" for i, v in enumerate(self.violations, 1))
        super().__init__(f"{title}: {len(self.violations)} problem(s)\n{body}")

    @property
    def fields(self) -> set[str]:
        """Every field named by any violation."""
        return {f for v in self.violations for f in v.fields}


class ConfigValidationError(ConfigError):
    """The finalized configuration breaks one or more rules: what ``cfg.validate()`` raises for
    every rule table (catch this class for any validation failure)."""


class CommOverlapConfigError(ConfigValidationError):
    """At least one communication-overlap prerequisite is unmet (all problems are listed, the
    other rules' too). A ``ConfigValidationError``: a failure with no overlap problem among its
    violations is raised as the base class."""


class OverrideError(ConfigError):
    """A YAML or dotted CLI override could not be applied; the input config is left unchanged.

    Built from the violations found, or from one message (``OverridesError("why")``, Megatron-Bridge's
    form): the message is then the error's text and ``violations`` is empty."""

    def __init__(self, violations: Sequence[Violation] | str, title: str = "invalid configuration") -> None:
        if isinstance(violations, str):
            self.violations = []
            ValueError.__init__(self, violations)
            return
        super().__init__(violations, title)


OverridesError = OverrideError
"""Megatron-Bridge's name of the override error: one class, so either name catches it."""


class UnknownFieldError(ConfigError, AttributeError):
    """A config dataclass was given an attribute it does not have (a typo would be silently ignored).

    Also an ``AttributeError``, which is what Python raises for a missing attribute.
    """

    def __init__(self, violations: Sequence[Violation], title: str, obj_name: str = "") -> None:
        super().__init__(violations, title)
        self.name = obj_name


class ArgumentError(ConfigError, TypeError):
    """A function of the public API (``pretrain``, a recipe) was given an argument it cannot take
    here: each violation names the argument, its value, why, and what to do instead.

    Also a ``TypeError``, which is what Python raises for an argument a function does not take.
    """


class ConfigFileNotFoundError(OverrideError, FileNotFoundError):
    """The config file given is not there: an ``OverrideError`` (a listed problem with its fix) and a
    ``FileNotFoundError`` (what Megatron-Bridge's helpers raise for it)."""


class MachineError(RuntimeError):
    """The machine cannot run the configuration (a GPU run without a visible GPU): raised by
    ``pretrain()`` before any process group or CUDA call, with what to change."""
