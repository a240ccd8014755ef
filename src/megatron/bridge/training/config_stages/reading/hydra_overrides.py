"""Megatron-Bridge's override helpers: a config as an omegaconf tree, Hydra-style edits, and back.

The documented workflow of Megatron-Bridge scripts works here with the same calls::

    tree, excluded = create_omegaconf_dict_config(cfg)
    tree = parse_hydra_overrides(tree, ["train.train_iters=100", "+tokenizer.hf_tokenizer_kwargs.use_fast=true"])
    apply_overrides(cfg, OmegaConf.to_container(tree, resolve=True), excluded)   # updates cfg

``cfg`` may be a whole ``ConfigContainer`` or any config dataclass. The override forms are Hydra's:
``key=value`` changes an existing key, ``+key=value`` adds a key that is not there, ``++key=value``
sets a key whether or not it is there, ``~key`` (or ``~key=value``) removes one. Values are read
as YAML. Unlike Hydra, every problem of a list is reported at once in one ``OverridesError``
(the same class as ``OverrideError``), and the dataclass fields' types still decide what a value
becomes when the tree is applied back.

One direction of calls: each item's value is read by :mod:`.override_text` and the resulting change
tree is applied, typed, by :func:`.overrides.with_overrides`; neither calls back here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from megatron.bridge.training.config_stages.reading.override_text import parse_value, plain, value_problem
from megatron.bridge.training.config_stages.reading.overrides import is_container, with_overrides
from megatron.bridge.training.config_stages.reading.references import check_reference_syntax
from megatron.bridge.training.config_stages.reading.shown import shown
from megatron.bridge.training.config_stages.reading.typed_values import (
    CallableNotAllowed,
    callable_path,
    field_annotations,
    resolve_config_callable,
)
from megatron.bridge.training.config_stages.reading.yaml_io import encode_value
from megatron.bridge.training.errors import OverrideError, Violation, did_you_mean

_ABSENT = object()


@dataclass(frozen=True)
class HydraOverride:
    """One parsed override: its form (``set``, ``add``, ``force``, ``delete``), key and value."""

    text: str
    form: str
    key: str
    value: Any = _ABSENT


def create_omegaconf_dict_config(config: Any) -> tuple[DictConfig, dict[str, Any]]:
    """``config`` (a config dataclass) as an omegaconf tree, and the values the tree cannot hold.

    Importable functions and dtypes become text as in the saved YAML; what has no text form (a
    lambda, a bound method, an arbitrary object) is left out of the tree and returned in the second
    value, dotted key -> value, for :func:`apply_overrides` to keep.
    """
    excluded: dict[str, Any] = {}
    return OmegaConf.create(_tree(config, "", excluded)), excluded


def _tree(obj: Any, path: str, excluded: dict[str, Any]) -> dict[str, Any]:
    """Fields of the dataclass ``obj`` as plain data; values without a text form go to ``excluded``."""
    data: dict[str, Any] = {}
    for name in field_annotations(type(obj)):
        dotted = f"{path}.{name}" if path else name
        value = getattr(obj, name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            data[name] = _tree(value, dotted, excluded)
            continue
        try:
            data[name] = plain(OmegaConf.create({"v": _tree_value(name, value)}))["v"]
        except (OverrideError, OmegaConfBaseException, ValueError):  # no text form: kept aside
            excluded[dotted] = value
    return data


ACTIVATION_FIELD = "activation_func"
ACTIVATION_ALIASES: dict[str, str] = {
    "relu2": "megatron.core.activations.squared_relu",
    "gelu_pytorch_tanh": "megatron.core.activations.fast_gelu",
}
"""Short activation names Megatron-Bridge writes that are not the function's own name."""


def _tree_value(name: str, value: Any) -> Any:
    """``value`` as the tree holds it: an activation function by its short name (``silu``, as
    Megatron-Bridge writes it) when that name reads back to the same function, else as saved YAML."""
    if name == ACTIVATION_FIELD and callable(value) and not isinstance(value, type):
        short = getattr(value, "__name__", "")
        if short and _read_activation(short) is value:
            return short
    return encode_value(value)


def _read_activation(text: str) -> Any:
    """The activation function ``text`` names (short name, alias or import path); ``None`` if none."""
    try:
        return resolve_config_callable(ACTIVATION_ALIASES.get(text, text), ACTIVATION_FIELD)
    except CallableNotAllowed:
        return None


def _activation_change(current: Any, new: Any) -> Any:
    """What an ``activation_func`` value in a tree changes: ``_ABSENT`` when it names ``current``
    (either spelling), its import path for another allowed function, else ``new`` as given."""
    if not isinstance(new, str):
        return new
    fn = _read_activation(new.strip())
    if fn is None:
        return new
    return _ABSENT if fn is current else callable_path(fn)


class OverrideValueError(ValueError):
    """The value of an override cannot be read (malformed YAML, a tag, a resolver): why and the fix."""

    def __init__(self, text: str, key: str, raw: str, rule: str, message: str, fix: str) -> None:
        super().__init__(text)
        self.key, self.raw, self.rule, self.message, self.fix = key, raw, rule, message, fix


def parse_override(text: str) -> HydraOverride:
    """``[~|+|++]key[=value]`` -> :class:`HydraOverride`; ``ValueError`` when it is malformed
    (:class:`OverrideValueError`, saying why, when only its value is)."""
    item = text.strip()
    form, rest = "set", item
    for prefix, name in (("++", "force"), ("+", "add"), ("~", "delete")):
        if item.startswith(prefix):
            form, rest = name, item[len(prefix) :]
            break
    key, sep, raw = rest.partition("=")
    key = key.strip()
    if not key or (form != "delete" and not sep):
        raise ValueError(text)
    if not sep:
        return HydraOverride(item, form, key)
    try:
        value = parse_value(raw)
    except (yaml.YAMLError, OmegaConfBaseException) as exc:
        rule, message, fix = value_problem(raw, exc)
        raise OverrideValueError(text, key, raw, rule, f"{shown(item)!r}: {message}", fix) from None
    problem = check_reference_syntax(value)
    if problem is not None:
        raise OverrideValueError(
            text, key, raw, "override-reference", f"{shown(item)!r}: {problem.message}", problem.fix
        )
    return HydraOverride(item, form, key, value)


def _lookup(tree: DictConfig, key: str) -> Any:
    return OmegaConf.select(tree, key, default=_ABSENT, throw_on_missing=False)


def _violation(item: HydraOverride, message: str, fix: str) -> Violation:
    return Violation("hydra-override", (item.key,), (item.text,), message, fix, value_label="given")


def _spelling_fix(tree: DictConfig, key: str) -> str:
    """Closest keys beside ``key`` in ``tree`` (did-you-mean), else how to add it."""
    parent_key, _, leaf = key.rpartition(".")
    parent = _lookup(tree, parent_key) if parent_key else tree
    choices = [str(k) for k in parent.keys()] if isinstance(parent, DictConfig) else []
    prefix = f"{parent_key}." if parent_key else ""
    return did_you_mean(leaf, choices, prefix) or f"check the spelling, or add a new key with +{key}=..."


def _apply_one(tree: DictConfig, item: HydraOverride) -> Violation | None:
    """Apply one override to ``tree``; the problem, if any, instead."""
    current = _lookup(tree, item.key)
    if item.form == "set" and current is _ABSENT:
        return _violation(item, f"{item.key!r} is not in the config", _spelling_fix(tree, item.key))
    if item.form == "add" and current is not _ABSENT:
        return _violation(
            item, f"{item.key!r} is already in the config", f"change it with {item.key}=... (or ++{item.key}=...)"
        )
    if item.form == "delete":
        if current is _ABSENT:
            return _violation(item, f"{item.key!r} is not in the config: nothing to remove", "check the spelling")
        if item.value is not _ABSENT and plain(current) != item.value:
            return _violation(item, f"{item.key!r} is {plain(current)!r}, not {item.value!r}", f"write ~{item.key}")
        parent_key, _, leaf = item.key.rpartition(".")
        parent = _lookup(tree, parent_key) if parent_key else tree
        with open_dict(parent):
            del parent[leaf]
        return None
    with open_dict(tree):
        OmegaConf.update(tree, item.key, item.value, merge=False, force_add=True)
    return None


def parse_hydra_overrides(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """Apply Hydra-style ``overrides`` to the omegaconf tree ``cfg`` (changed and returned).

    Raises ``OverridesError`` listing every override that is malformed, changes a key that is not
    there, adds one that is, or removes a missing one.
    """
    errors: list[Violation] = []
    for text in overrides:
        try:
            item = parse_override(str(text))
        except OverrideValueError as bad:
            errors.append(Violation(bad.rule, (bad.key,), (shown(bad.raw),), bad.message, bad.fix, value_label="given"))
            continue
        except ValueError:
            errors.append(
                Violation(
                    "override-syntax",
                    (str(text),),
                    (shown(text),),
                    f"{shown(text)!r} is not an override",
                    "write key=value, +key=value, ++key=value or ~key",
                    value_label="given",
                )
            )
            continue
        problem = _apply_one(cfg, item)
        if problem is not None:
            errors.append(problem)
    if errors:
        raise OverrideError(errors, "invalid Hydra-style overrides")
    return cfg


def changed_values(obj: Any, data: Mapping[str, Any]) -> dict[str, Any]:
    """The part of ``data`` (a tree for the dataclass ``obj``) that differs from ``obj``.

    Keys that are not fields stay in (the override reports them); a sub-config is compared field
    by field, any other value as a whole.
    """
    names = set(field_annotations(type(obj)))
    out: dict[str, Any] = {}
    for key, new in data.items():
        if key not in names:
            out[key] = new
            continue
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current) and not isinstance(current, type) and isinstance(new, Mapping):
            sub = changed_values(current, new)
            if sub:
                out[key] = sub
        elif key == ACTIVATION_FIELD:
            change = _activation_change(current, new)
            if change is not _ABSENT:
                out[key] = change
        elif _as_text(current) != new:
            out[key] = new
    return out


def _as_text(value: Any) -> Any:
    try:
        return encode_value(value)
    except OverrideError:  # no text form: never equal to parsed data
        return _ABSENT


def _deleted_fields(cfg: Any, items: Sequence[HydraOverride]) -> list[Violation]:
    """``~key`` on a dataclass field: a field cannot be removed, only set."""
    errors = []
    for item in items:
        if item.form != "delete":
            continue
        holder_path, _, name = item.key.rpartition(".")
        holder = cfg
        for part in holder_path.split(".") if holder_path else ():
            holder = getattr(holder, part, None)
        if dataclasses.is_dataclass(holder) and name in field_annotations(type(holder)):
            errors.append(
                _violation(
                    item,
                    f"{item.key!r} is a field of {type(holder).__name__}: it cannot be removed",
                    f"set it instead ({item.key}=null or a value)",
                )
            )
    return errors


def hydra_changes(cfg: Any, overrides: Sequence[str]) -> dict[str, Any]:
    """Dotted overrides in Hydra's forms as the nested changes they make to ``cfg``."""
    items, errors = [], []
    for text in overrides:
        try:
            items.append(parse_override(str(text)))
        except ValueError:
            pass  # reported by parse_hydra_overrides below
    errors += _deleted_fields(cfg, items)
    tree, _ = create_omegaconf_dict_config(cfg)
    try:
        parse_hydra_overrides(tree, overrides)
    except OverrideError as exc:
        errors += exc.violations
    if errors:
        raise OverrideError(errors, "invalid Hydra-style overrides")
    return changed_values(cfg, plain(tree))


def apply_in_place(cfg: Any, overrides: Any, excluded_fields: Mapping[str, Any], source: str = "cli") -> Any:
    """Megatron-Bridge's ``apply_overrides(cfg, overrides, excluded_fields)``: update ``cfg`` itself.

    Only values that differ from ``cfg`` are applied (typed and checked as every override, all at
    once, before anything changes); the excluded fields keep their values. Returns ``cfg``.
    """
    if isinstance(overrides, DictConfig):
        overrides = plain(overrides)
    if not isinstance(overrides, Mapping):
        changes: Any = hydra_changes(cfg, overrides)
    else:
        changes = changed_values(cfg, overrides)
    if not changes:
        return cfg
    updated = with_overrides(cfg, changes, source)
    for f in dataclasses.fields(cfg):
        if f.name in changes or (is_container(cfg) and f.name == "provenance"):
            setattr(cfg, f.name, getattr(updated, f.name))
    _restore(cfg, excluded_fields, changes)
    return cfg


def _restore(cfg: Any, excluded_fields: Mapping[str, Any], changes: Mapping[str, Any]) -> None:
    """Put back excluded values that the applied changes did not set (keys as dotted paths, with or
    without Megatron-Bridge's ``root.`` prefix)."""
    for dotted, value in excluded_fields.items():
        parts = excluded_path(cfg, dotted)
        node: Any = changes
        for part in parts:
            node = node.get(part, _ABSENT) if isinstance(node, Mapping) else _ABSENT
        if node is not _ABSENT:
            continue
        holder = cfg
        for part in parts[:-1]:
            holder = getattr(holder, part)
        if getattr(holder, parts[-1]) is not value:
            setattr(holder, parts[-1], value)


ROOT_PREFIX = "root"
"""First part of the excluded-field keys Megatron-Bridge writes (``root.model.init_method``)."""


def excluded_path(cfg: Any, dotted: str) -> list[str]:
    """The field path of an excluded-field key of ``cfg``: ``model.init_method`` or
    ``root.model.init_method`` (``root`` is a prefix unless ``cfg`` has a field of that name)."""
    parts = dotted.split(".")
    prefixed = len(parts) > 1 and parts[0] == ROOT_PREFIX and ROOT_PREFIX not in field_annotations(type(cfg))
    return parts[1:] if prefixed else parts


def has_hydra_prefix(overrides: Sequence[str]) -> bool:
    """Whether any dotted override uses Hydra's ``+``, ``++`` or ``~`` form."""
    return any(str(item).lstrip().startswith(("+", "~")) for item in overrides)


def apply_overrides(
    cfg: Any,
    overrides: Mapping[str, Any] | Sequence[str],
    excluded_fields: Mapping[str, Any] | None = None,
    *,
    source: str = "cli",
) -> Any:
    """``cfg`` (a ``ConfigContainer`` or any config dataclass) with ``overrides`` applied, typed.

    ``overrides`` is a nested mapping or dotted strings (Hydra's ``+key=``, ``++key=`` and ``~key``
    forms included). Raises ``OverrideError`` listing every problem (a write to a copy whose owner
    gives it another value included); on error ``cfg`` is unchanged.

    Two forms: ``apply_overrides(cfg, overrides)`` returns an updated copy and leaves ``cfg`` as it
    is. ``apply_overrides(cfg, overrides, excluded_fields)`` (Megatron-Bridge's form, with what
    :func:`create_omegaconf_dict_config` returned) updates ``cfg`` itself and returns it: only the
    values that differ from ``cfg`` are applied, and the excluded fields keep their values.
    """
    if excluded_fields is not None:
        return apply_in_place(cfg, overrides, excluded_fields, source=source)
    if not isinstance(overrides, Mapping) and has_hydra_prefix(overrides):
        overrides = hydra_changes(cfg, overrides)
    return with_overrides(cfg, overrides, source)
