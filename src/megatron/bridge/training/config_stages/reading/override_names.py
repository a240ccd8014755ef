"""Misspelt dotted-override names, refused from the stored field names before megatron-core loads.

The config classes include megatron-core's (the model provider, the optimizer, DDP), so knowing
their fields means importing torch and megatron-core: seconds. Their names are stored instead in
``config_field_names.json`` (a test holds it equal to the classes; ``python -m
megatron.bridge.training.utils.omegaconf_utils --write-field-names`` writes it), and this module,
which imports neither, reads them to refuse a name no config has, in the words of the full check
(:func:`unknown_field`, which ``overrides`` uses too).

It refuses only what the full check refuses as well; everything else is left to it:

* a key below a field that is not a sub-config (an open dict such as
  ``tokenizer.hf_tokenizer_kwargs``, or a plain value, whose own check names the type);
* every key of a sub-config whose class an override names (``model._target_=...``);
* every name, when the installed megatron-core is not the one the names were stored from.

A sub-config's names are those of its class and of every subclass (the model field holds the
recipe's provider, a subclass of ``GPTModelProvider``), so a name is refused only when no class
that field can hold has it. Hydra's forms (``+key``, ``++key``, ``~key``) name their key as
``key=value`` does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from megatron.bridge.training.config_stages.reading.shown import short_text, shown
from megatron.bridge.training.errors import OverrideError, Violation, did_you_mean

SNAPSHOT_PATH = Path(__file__).with_name("config_field_names.json")
UNKNOWN_KEY_RULE = "override-unknown-key"
TARGET_KEY = "_target_"
"""The key that names a sub-config's class (``overrides.TARGET_KEY``)."""
MEGATRON_CORE = "megatron-core"


# --------------------------------------------------------------------------------------------- the words
def unknown_field(dotted: str, given: Any, class_name: str, choices: Sequence[str], prefix: str) -> Violation:
    """``dotted`` is not a field of ``class_name``: the closest of ``choices`` (did-you-mean), else the
    first of them. The one wording of an unknown override key, early or in the full check."""
    fix = did_you_mean(dotted.rpartition(".")[2], choices, prefix) or (
        f"check the spelling; valid keys here: {', '.join(sorted(choices)[:12])}, ..."
    )
    return Violation(
        UNKNOWN_KEY_RULE,
        (short_text(dotted),),
        (shown(given),),
        f"{short_text(dotted)!r} is not a field of {class_name}",
        fix,
        value_label="given",
    )


# --------------------------------------------------------------------------------------------- the check
def installed_megatron_core_version() -> str | None:
    """The installed megatron-core's version, from its distribution's metadata (nothing is imported)."""
    try:
        return metadata.version(MEGATRON_CORE)
    except metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def stored_names() -> dict[str, Any]:
    return json.loads(SNAPSHOT_PATH.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class _Item:
    """One override: its text, key parts and value text (``None`` for Hydra's ``~key``)."""

    text: str
    parts: list[str]
    raw: str | None

    def given(self) -> Any:
        """What a message shows as given: the value as the full check reads it (plain YAML), else its
        text; for a delete, the override itself."""
        return self.text.strip() if self.raw is None else _read_value(self.raw)


def _item(text: str) -> _Item | None:
    """``[+|++|~]a.b.c[=value]`` -> its key parts and value; ``None`` when it has no key to judge."""
    body = text.strip().lstrip("+~")
    key, sep, raw = body.partition("=")
    parts = key.strip().split(".")
    if not all(parts):
        return None  # malformed: the full check says why
    return _Item(text, parts, raw if sep and not text.strip().startswith("~") else None)


def _read_value(raw: str) -> Any:
    """``raw`` read as plain YAML; the text itself when it is not (a tag, a number Python cannot hold):
    the full check reads those, this is only what a message shows."""
    # Deferred: only a refused name is shown with its value.
    import yaml

    try:
        value = yaml.safe_load(raw)
    except Exception:  # noqa: BLE001 - any text: what the message shows, nothing more
        return raw
    return value if isinstance(value, (str, int, float, bool, list, dict, type(None))) else raw


def unknown_override_names(overrides: Sequence[str]) -> list[Violation]:
    """A violation for each name among ``overrides`` that no config class has (keys under one unknown
    name are one violation, with their values together, as the full check gives them)."""
    names = stored_names()
    if installed_megatron_core_version() != names["megatron_core_version"]:
        return []
    items = [item for item in map(_item, overrides) if item is not None]
    targeted = {tuple(item.parts[:-1]) for item in items if item.parts[-1] == TARGET_KEY}
    unknown: dict[str, tuple[str, list[str], str, Any]] = {}
    for item in items:
        found = _first_unknown(names, item.parts, targeted)
        if found is None:
            continue
        depth, class_name, choices = found
        dotted = ".".join(item.parts[: depth + 1])
        value = _nested(item.parts[depth + 1 :], item.given())
        if dotted in unknown:
            value = _merged(unknown[dotted][3], value)
        unknown[dotted] = (class_name, choices, ".".join(item.parts[:depth]), value)
    return [
        unknown_field(dotted, value, class_name, choices, f"{prefix}." if prefix else "")
        for dotted, (class_name, choices, prefix, value) in unknown.items()
    ]


def _first_unknown(
    names: Mapping[str, Any], parts: list[str], targeted: set[tuple[str, ...]]
) -> tuple[int, str, list[str]] | None:
    """Where ``parts`` first names no field: ``(index, class name, its fields)``; ``None`` when every
    part is a field, or the rest is not the schema's to judge."""
    class_name: str | None = names["root"]
    for depth, part in enumerate(parts):
        if class_name is None or part == TARGET_KEY or tuple(parts[:depth]) in targeted:
            return None
        entry = names["classes"][class_name]
        if part in entry["aliases"]:
            return None
        if part not in entry["fields"]:
            return depth, class_name, list(entry["fields"])
        class_name = entry["fields"][part]
    return None


def _nested(parts: Sequence[str], value: Any) -> Any:
    for part in reversed(parts):
        value = {part: value}
    return value


def _merged(old: Any, new: Any) -> Any:
    if isinstance(old, dict) and isinstance(new, dict):
        out = dict(old)
        for key, value in new.items():
            out[key] = _merged(out[key], value) if key in out else value
        return out
    return new


def check_override_names(overrides: Sequence[str], title: str = "invalid cli overrides") -> None:
    """Raise ``OverrideError`` listing every name among ``overrides`` that no config class has."""
    problems = unknown_override_names(overrides)
    if problems:
        raise OverrideError(problems, title)


# --------------------------------------------------------------------------------------------- storing
def field_names_snapshot(root: type) -> dict[str, Any]:
    """The names :func:`unknown_override_names` reads, taken from the config classes under ``root``:
    for each class, its fields (name -> the sub-config class's name, or ``None``) and aliases, each
    sub-config with the fields of its subclasses (the model providers are all imported first)."""
    # Deferred: the classes' annotations import torch and megatron-core (and every model provider).
    import importlib
    import pkgutil

    import megatron.bridge.models as models

    for module in pkgutil.walk_packages(models.__path__, f"{models.__name__}."):
        importlib.import_module(module.name)
    classes: dict[str, Any] = {}
    _add_class(root, classes, {})
    return {"megatron_core_version": installed_megatron_core_version(), "root": root.__name__, "classes": classes}


def _add_class(cls: type, classes: dict[str, Any], seen: dict[str, type]) -> str:
    """Store ``cls`` (and, first, the sub-configs it holds) under its name; returns the name."""
    from megatron.bridge.training.config_stages.reading.typed_values import dataclass_in, field_annotations

    name = cls.__name__
    if seen.setdefault(name, cls) is not cls:
        raise ValueError(
            f"two config classes are named {name}: {seen[name]} and {cls}; a message names a class "
            "by its name, so rename one"
        )
    if name in classes:
        return name
    entry: dict[str, Any] = {"fields": {}, "aliases": []}
    classes[name] = entry
    for kind in [cls, *_subclasses(cls)]:
        for field_name, annotation in field_annotations(kind).items():
            sub = dataclass_in(annotation)
            entry["fields"].setdefault(field_name, _add_class(sub, classes, seen) if sub is not None else None)
        entry["aliases"] += [a for a in getattr(kind, "FIELD_ALIASES", {}) if a not in entry["aliases"]]
    return name


PROJECT_PACKAGE = "megatron.bridge."


def _subclasses(cls: type) -> list[type]:
    """The project's loaded subclasses of ``cls`` (what a recipe or a ``_target_`` may put in its
    place), in a stable order."""
    found: dict[str, type] = {}
    todo: list[type] = list(cls.__subclasses__())
    while todo:
        sub = todo.pop()
        if sub.__module__.startswith(PROJECT_PACKAGE) and "<" not in sub.__qualname__:
            found[f"{sub.__module__}.{sub.__qualname__}"] = sub
        todo += sub.__subclasses__()
    return [found[name] for name in sorted(found)]


def write_snapshot(root: type) -> Path:
    """Store :func:`field_names_snapshot` of ``root`` where the check reads it."""
    SNAPSHOT_PATH.write_text(json.dumps(field_names_snapshot(root), indent=1) + "\n", encoding="utf-8")
    stored_names.cache_clear()
    return SNAPSHOT_PATH
