"""Config dataclasses refuse attributes they do not have, naming the closest field.

A plain dataclass accepts ``cfg.dataset.data_pth = "/data/x"`` and the run silently trains without
it. Every config class of a run (``ConfigContainer``, its sub-configs, the model provider, and the
megatron-core optimizer/DDP configs a container holds) refuses such an assignment with
:class:`UnknownFieldError`, which names the class, the attribute and the closest field.

What stays allowed: fields, properties and other names the class defines, private names (``_x``),
and assignments made by megatron-core's own code, which attaches run-time attributes to its
configs (hooks such as ``no_sync_func`` and values derived in ``__post_init__``).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from typing import Any

from megatron.bridge.utils.error_types import UnknownFieldError, Violation, did_you_mean

_STRICT_SUBCLASSES: dict[type, type] = {}
"""megatron-core config class -> its registered strict subclass."""

_RUNTIME_OWNER_PREFIX = "megatron.core"
"""Modules whose code may attach attributes to a config at run time."""


@functools.cache
def known_attributes(cls: type) -> frozenset[str]:
    """Every name ``cls`` defines: dataclass fields, properties, methods, class attributes."""
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    names.update(dir(cls))
    return frozenset(names)


def settable_fields(cls: type) -> list[str]:
    """What a user may set on ``cls``: its fields and the properties with a setter (aliases)."""
    names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
    names += [n for n in dir(cls) if isinstance(getattr(cls, n, None), property) and getattr(cls, n).fset]
    return names


def class_label(cls: type) -> str:
    """The name users know ``cls`` by (a registered strict subclass shows its megatron-core name)."""
    for base, strict in _STRICT_SUBCLASSES.items():
        if cls is strict:
            return base.__name__
    return cls.__name__


def unknown_field_error(cls: type, name: str, value: Any) -> UnknownFieldError:
    """The error for ``cls.name = value``: the class, the attribute, the closest fields."""
    label = class_label(cls)
    fix = did_you_mean(name, settable_fields(cls))
    fix = fix or "check the spelling; the fields are listed in the class's documentation"
    violation = Violation(
        "unknown-config-attribute",
        (f"{label}.{name}",),
        (value,),
        f"{label} has no field {name!r}: the value would be silently ignored",
        fix,
        value_label="given",
    )
    return UnknownFieldError([violation], f"cannot set {label}.{name}", obj_name=name)


def _set_by_megatron_core(depth: int) -> bool:
    """Whether the code assigning (``depth`` frames up) is megatron-core's own."""
    module = sys._getframe(depth).f_globals.get("__name__", "")
    return module == _RUNTIME_OWNER_PREFIX or module.startswith(_RUNTIME_OWNER_PREFIX + ".")


def check_attribute(obj: Any, name: str, value: Any) -> None:
    """Raise :class:`UnknownFieldError` for an unknown public attribute set outside megatron-core."""
    if name.startswith("_") or name in known_attributes(type(obj)):
        return
    if _set_by_megatron_core(3):
        return
    raise unknown_field_error(type(obj), name, value)


class StrictFields:
    """Mixin for config dataclasses: assigning an attribute the class does not define is an error."""

    def __setattr__(self, name: str, value: Any) -> None:
        check_attribute(self, name, value)
        super().__setattr__(name, value)


def register_strict(strict: type) -> type:
    """Class decorator: ``strict`` (a ``StrictFields`` subclass of one megatron-core config class)
    is what :func:`make_strict` turns instances of that class into."""
    base = next(b for b in strict.__mro__[1:] if not issubclass(b, StrictFields))
    _STRICT_SUBCLASSES[base] = strict
    return strict


def strict_class(cls: type) -> type:
    """The registered strict subclass of ``cls``, or ``cls`` when it is strict already or none is
    registered (such instances are left as they are)."""
    if issubclass(cls, StrictFields):
        return cls
    return _STRICT_SUBCLASSES.get(cls, cls)


def make_strict(value: Any) -> Any:
    """``value`` (a config dataclass instance) with its class swapped for :func:`strict_class`."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and not isinstance(value, StrictFields):
        object.__setattr__(value, "__class__", strict_class(type(value)))
    return value
