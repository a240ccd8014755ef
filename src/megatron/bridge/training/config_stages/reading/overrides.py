"""Typed dotted overrides on a dataclass tree: each layer (YAML, flags, CLI) applied to a copy.

Every accepted leaf is recorded in the container's ``provenance`` under the layer's name, and every
problem of a layer is reported at once in one :class:`OverrideError`. A layer may not write a
field that is a copy of another field (see :mod:`megatron.bridge.training.config_stages.facts.ownership`) unless it
writes the owner's value: the conflict is refused here, when the layer is parsed.

The text of dotted items is read by :mod:`.override_text`; Hydra's ``+``/``++``/``~`` forms are
turned into a change tree by :mod:`.hydra_overrides`, which then calls :func:`with_overrides`. The
calls go that one way: nothing here calls back into ``hydra_overrides``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from megatron.bridge.models.gpt_provider import GPTModelProvider
from megatron.bridge.training.config_stages.facts import ownership
from megatron.bridge.training.config_stages.reading.override_names import unknown_field
from megatron.bridge.training.config_stages.reading.override_text import plain, read_dotlist
from megatron.bridge.training.config_stages.reading.references import resolve_references
from megatron.bridge.training.config_stages.reading.shown import shown
from megatron.bridge.training.config_stages.reading.typed_values import (
    CallableNotAllowed,
    Mismatch,
    convert_value,
    dataclass_in,
    field_annotations,
    import_object,
)
from megatron.bridge.training.config_stages.schema import copy_records
from megatron.bridge.training.errors import OverrideError, Violation

_ABSENT = object()

TARGET_KEY = "_target_"
"""YAML key recording the class of a sub-config whose runtime class is a subclass (model providers)."""


def _target_package(base: type) -> str:
    """Where the classes a ``_target_`` may name for ``base`` live: the project's own package
    (model providers: ``megatron.bridge.models``)."""
    return "megatron.bridge.models" if issubclass(base, GPTModelProvider) else "megatron.bridge"


def _in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def allowed_targets(base: type) -> dict[str, type]:
    """Import path -> class, for every class a config file's ``_target_`` may name in place of
    ``base``: ``base`` and its subclasses defined in the project's package (for a model, the
    providers under ``megatron.bridge.models``)."""
    package = _target_package(base)
    found: dict[str, type] = {}
    todo = [base]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if _in_package(cls.__module__, package) and "<" not in cls.__qualname__:
            found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


def class_from_target(target: Any, base: type, path: str, errors: list[Violation]) -> type | None:
    """The class a ``_target_`` names, when it is one of :func:`allowed_targets`; else a violation.

    A name outside the project's package is refused from its text: nothing is imported for it.
    """
    text = str(target).strip()
    allowed = allowed_targets(base)
    cls = allowed.get(text)
    if cls is None and _in_package(text.rpartition(".")[0], _target_package(base)):
        try:  # another spelling of an allowed class (a package that re-exports it)
            found = import_object(text)
        except (ImportError, AttributeError):
            found = None
        cls = found if found in allowed.values() else None
    if cls is None:
        errors.append(
            Violation(
                "config-target-not-allowed",
                (f"{path}.{TARGET_KEY}",),
                (shown(target),),
                f"{shown(text)!r} is not one of the project's {base.__name__} classes; a config names only "
                "those (a name outside the project's package is never imported)",
                "use one of: " + ", ".join(sorted(allowed)),
                value_label="given",
            )
        )
        return None
    return cls


@dataclass
class _Layer:
    """One override layer being applied: its name, what it wrote, what went wrong."""

    source: str
    provenance: dict[str, str]
    errors: list[Violation] = field(default_factory=list)
    written: list[str] = field(default_factory=list)


def _apply_tree(obj: Any, changes: Mapping[str, Any], path: str, layer: _Layer) -> Any:
    """Return ``obj`` rebuilt with ``changes``; dataclasses are re-created so their checks re-run."""
    errors = layer.errors
    cls = type(obj)
    if TARGET_KEY in changes:
        target_cls = class_from_target(changes[TARGET_KEY], _declared_base(cls), path, errors)
        if target_cls is not None and target_cls is not cls:
            obj, cls = _retarget(obj, target_cls), target_cls
    annotations = field_annotations(cls)
    updates: dict[str, Any] = {}
    for key, raw in changes.items():
        if key == TARGET_KEY:
            continue
        owner = getattr(cls, "FIELD_ALIASES", {}).get(key)
        if owner is not None:  # another name of one field (e.g. Megatron-Bridge's spelling)
            key, raw = owner[0], owner[1](raw)
        dotted = f"{path}.{key}" if path else key
        if key not in annotations:
            errors.append(unknown_field(dotted, raw, cls.__name__, list(annotations), f"{path}." if path else ""))
            continue
        annotation = annotations[key]
        sub_cls = dataclass_in(annotation)
        current = getattr(obj, key)
        if sub_cls is not None and isinstance(raw, Mapping):
            base = _base_instance(current, sub_cls, dotted, errors)
            if base is not None:
                updates[key] = _apply_tree(base, raw, dotted, layer)
            continue
        try:
            updates[key] = convert_value(raw, annotation, key)
        except CallableNotAllowed as refused:
            errors.append(
                Violation(
                    "config-callable-not-allowed",
                    (dotted,),
                    (shown(raw),),
                    f"{dotted} may name only {refused.expected}, not {shown(raw)!r} (a config cannot make the "
                    "run import anything else)",
                    f"use one of: {refused.allowed}"
                    if refused.allowed != "none"
                    else f"leave {dotted} out of the config file and set it in Python",
                    value_label="given",
                )
            )
            continue
        except Mismatch as mismatch:
            errors.append(
                Violation(
                    "override-type",
                    (dotted,),
                    (shown(raw),),
                    f"{dotted} expects {mismatch.expected}, got {shown(raw)!r}",
                    f"give {dotted} a value of type {mismatch.expected}",
                    value_label="given",
                )
            )
            continue
        layer.provenance[dotted] = layer.source
        layer.written.append(dotted)
    return _rebuild(obj, updates) if updates else obj


def _declared_base(cls: type) -> type:
    """The most general dataclass a ``_target_`` may name in place of ``cls``."""
    return GPTModelProvider if issubclass(cls, GPTModelProvider) else cls


def _retarget(obj: Any, target_cls: type) -> Any:
    """A ``target_cls`` instance carrying the fields of ``obj`` that the target also has."""
    names = set(field_annotations(target_cls))
    kept = {k: getattr(obj, k) for k in field_annotations(type(obj)) if k in names}
    return target_cls(**kept)


def _base_instance(current: Any, cls: type, path: str, errors: list[Violation]) -> Any:
    """What a mapping of overrides for ``path`` is applied to: the current sub-config, one built
    from a name the field holds (``mixed_precision: bf16_mixed`` -> its object form), or a default."""
    if isinstance(current, cls):
        return current
    if isinstance(current, str) and hasattr(cls, "from_name"):
        try:
            return cls.from_name(current)
        except KeyError:
            pass
    return _default_instance(cls, path, errors)


def _default_instance(cls: type, path: str, errors: list[Violation]) -> Any:
    """A default-constructed sub-config, for overrides under a sub-config that is currently None."""
    try:
        return cls()
    except TypeError as exc:
        errors.append(
            Violation(
                "override-none-subconfig",
                (path,),
                (None,),
                f"{path} is null and {cls.__name__} has required fields ({exc})",
                f"set {path} in Python or give all of its required fields",
            )
        )
        return None


def _rebuild(obj: Any, updates: dict[str, Any]) -> Any:
    """``dataclasses.replace`` so that ``__post_init__`` re-derives fields from the new values; the new
    section keeps the record of what its owners wrote into its copies (a copy the override did not
    touch is still its owner's)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        rebuilt = dataclasses.replace(obj, **updates)
        copy_records.follow_copy(obj, rebuilt)
        return rebuilt
    for key, value in updates.items():
        setattr(obj, key, value)
    return obj


def with_overrides(cfg: Any, overrides: Mapping[str, Any] | Sequence[str], source: str = "cli") -> Any:
    """A copy of ``cfg`` (a ``ConfigContainer`` or any config dataclass) with ``overrides`` (nested
    mapping or dotted strings) applied, typed; ``cfg`` itself is never modified.

    For a container every accepted leaf is recorded in ``provenance`` under ``source``. Raises
    ``OverrideError`` listing every problem (a write to a copy whose owner gives it another value
    included).
    """
    errors: list[Violation]
    if isinstance(overrides, Mapping):
        changes, errors = plain(overrides), []
    else:
        changes, errors = read_dotlist(overrides)
    changes, reference_errors = resolve_references(cfg, changes)
    errors += reference_errors
    if not is_container(cfg):
        layer = _Layer(source, {}, errors)
        result = _apply_tree(copy.deepcopy(cfg), changes, "", layer)
        if layer.errors:
            raise OverrideError(layer.errors, f"invalid {source} overrides")
        return result
    layer = _Layer(source, dict(cfg.provenance), errors)
    changes = {k: v for k, v in changes.items() if k != "provenance"}
    result = _apply_tree(copy.deepcopy(cfg), changes, "", layer)
    layer.errors += ownership.override_violations(result, layer.written)
    if layer.errors:
        raise OverrideError(layer.errors, f"invalid {source} overrides")
    out = dataclasses.replace(result, provenance=layer.provenance)
    ownership.remember(out, ownership.accepted_copies(out, layer.written))
    return out


def is_container(obj: Any) -> bool:
    """The root of a run's configuration (the one dataclass that records provenance)."""
    return dataclasses.is_dataclass(obj) and "provenance" in {f.name for f in dataclasses.fields(obj)}
