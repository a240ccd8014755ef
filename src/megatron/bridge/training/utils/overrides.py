"""Typed dotted overrides on a dataclass tree: each layer (YAML, flags, CLI) applied to a copy.

Every accepted leaf is recorded in the container's ``provenance`` under the layer's name, and every
problem of a layer is reported at once in one :class:`OverrideError`. A layer may not write a
field that is a copy of another field (see :mod:`megatron.bridge.training.ownership`) unless it
writes the owner's value: the conflict is refused here, when the layer is parsed.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Union

from omegaconf import DictConfig, ListConfig, OmegaConf

from megatron.bridge.training import ownership
from megatron.bridge.training.errors import OverrideError, Violation, did_you_mean
from megatron.bridge.training.utils.typed_values import (
    Mismatch,
    convert_value,
    dataclass_in,
    field_annotations,
    import_object,
)

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

TARGET_KEY = "_target_"
"""YAML key recording the class of a sub-config whose runtime class is a subclass (model providers)."""


def plain(node: Any) -> Any:
    """omegaconf containers -> plain Python containers."""
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    return node


def _suggest(key: str, choices: Sequence[str], prefix: str) -> str:
    """Closest valid dotted keys at the same level, for unknown-key errors."""
    fallback = f"check the spelling; valid keys here: {', '.join(sorted(choices)[:12])}, ..."
    return did_you_mean(key, choices, prefix) or fallback


def class_from_target(target: Any, base: type, path: str, errors: list[Violation]) -> Optional[type]:
    try:
        cls = import_object(str(target))
    except (ImportError, AttributeError):
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, base)):
        errors.append(
            Violation(
                "override-target",
                (f"{path}.{TARGET_KEY}",),
                (target,),
                f"{target!r} is not an importable subclass of {base.__name__}",
                f"use the import path of a {base.__name__} subclass",
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
            errors.append(
                Violation(
                    "override-unknown-key",
                    (dotted,),
                    (raw,),
                    f"{dotted!r} is not a field of {cls.__name__}",
                    _suggest(key, list(annotations), f"{path}." if path else ""),
                    value_label="given",
                )
            )
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
            updates[key] = convert_value(raw, annotation)
        except Mismatch as mismatch:
            errors.append(
                Violation(
                    "override-type",
                    (dotted,),
                    (raw,),
                    f"{dotted} expects {mismatch.expected}, got {raw!r}",
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
    from megatron.bridge.models.gpt_provider import GPTModelProvider

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
    """``dataclasses.replace`` so that ``__post_init__`` re-derives fields from the new values."""
    if dataclasses.is_dataclass(obj):
        return dataclasses.replace(obj, **updates)
    for key, value in updates.items():
        setattr(obj, key, value)
    return obj


def parse_dotlist(overrides: Sequence[str]) -> dict[str, Any]:
    """``["a.b=1", "c=[1,2]"]`` -> nested dict, values parsed by omegaconf (YAML syntax)."""
    errors = []
    for item in overrides:
        key, sep, _ = item.partition("=")
        if not sep or not key.strip():
            errors.append(
                Violation(
                    "override-syntax",
                    (item,),
                    (item,),
                    f"{item!r} is not a dotted override",
                    "write key.path=value, e.g. model.num_layers=4",
                )
            )
    if errors:
        raise OverrideError(errors, "could not parse overrides")
    return plain(OmegaConf.from_dotlist(list(overrides)))


def has_hydra_prefix(overrides: Sequence[str]) -> bool:
    """Whether any dotted override uses Hydra's ``+``, ``++`` or ``~`` form."""
    return any(str(item).lstrip().startswith(("+", "~")) for item in overrides)


def with_overrides(cfg: Any, overrides: Union[Mapping[str, Any], Sequence[str]], source: str = "cli") -> Any:
    """A copy of ``cfg`` (a ``ConfigContainer`` or any config dataclass) with ``overrides`` (nested
    mapping or dotted strings) applied, typed; ``cfg`` itself is never modified.

    For a container every accepted leaf is recorded in ``provenance`` under ``source``. Raises
    ``OverrideError`` listing every problem (a write to a copy whose owner gives it another value
    included).
    """
    changes = parse_dotlist(overrides) if not isinstance(overrides, Mapping) else plain(overrides)
    if not is_container(cfg):
        layer = _Layer(source, {})
        result = _apply_tree(copy.deepcopy(cfg), changes, "", layer)
        if layer.errors:
            raise OverrideError(layer.errors, f"invalid {source} overrides")
        return result
    layer = _Layer(source, dict(cfg.provenance))
    changes = {k: v for k, v in changes.items() if k != "provenance"}
    result = _apply_tree(copy.deepcopy(cfg), changes, "", layer)
    layer.errors += ownership.override_violations(result, layer.written)
    if layer.errors:
        raise OverrideError(layer.errors, f"invalid {source} overrides")
    out = dataclasses.replace(result, provenance=layer.provenance)
    ownership.carry_memory(cfg, out)
    ownership.remember(out, ownership.accepted_copies(out, layer.written))
    return out


def is_container(obj: Any) -> bool:
    """The root of a run's configuration (the one dataclass that records provenance)."""
    return dataclasses.is_dataclass(obj) and "provenance" in {f.name for f in dataclasses.fields(obj)}
