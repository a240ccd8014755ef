"""What resolution last wrote into each megatron-facing copy, kept beside the config objects.

A copy (``model.delay_wgrad_compute``, ``ddp.overlap_grad_reduce``, the precision flags) is written
by resolution from its owner. To tell such a value from one a user wrote in Python, the value
written is recorded here, per holder object (the ``model``/``ddp``/``optimizer`` instance), never
as an attribute of the config. The record follows the holder: a container rebuilt around the same
sections (``dataclasses.replace``) keeps it, a deep copy of a container takes it along
(``ConfigContainer.__deepcopy__``), and it goes away with the holder.
"""

from __future__ import annotations

import weakref
from typing import Any

_RECORDS: dict[int, tuple[weakref.ref, dict[str, Any]]] = {}
"""``id(holder)`` -> (a weak reference to the holder, field name -> value resolution wrote)."""

NOT_RECORDED = object()
"""What :func:`recorded` returns for a field resolution never wrote on that holder."""


def _entry(holder: Any) -> dict[str, Any] | None:
    found = _RECORDS.get(id(holder))
    if found is None or found[0]() is not holder:
        return None
    return found[1]


def record(holder: Any, name: str, value: Any) -> None:
    """Remember that resolution gave ``holder.<name>`` the value ``value``."""
    values = _entry(holder)
    if values is None:
        key = id(holder)

        def forget(_ref: Any, key: int = key) -> None:  # the holder is gone: so is its record
            _RECORDS.pop(key, None)

        ref = weakref.ref(holder, forget)
        values = {}
        _RECORDS[key] = (ref, values)
    values[name] = value


def recorded(holder: Any, name: str) -> Any:
    """The value resolution last gave ``holder.<name>``, or :data:`NOT_RECORDED`."""
    values = _entry(holder)
    return NOT_RECORDED if values is None else values.get(name, NOT_RECORDED)


def follow_copy(source: Any, copied: Any) -> None:
    """Give ``copied`` (a copy of the holder ``source``) the record of ``source``."""
    values = _entry(source)
    if values is not None and copied is not source:
        for name, value in values.items():
            record(copied, name, value)
