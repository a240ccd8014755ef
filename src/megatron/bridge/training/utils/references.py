"""``${section.field}`` references in overrides and config files: what they mean, resolved here.

A reference names one field by its full dotted key and stands for that field's value: the value the
same layer (one YAML file, or one command line of overrides) gives it, else the config's value
before the layer. A whole-string reference keeps the value's type; inside text it is the value's
text. ``\\${`` is a literal ``${``. Resolvers (``${oc.env:...}`` and the like), relative and nested
references are refused: a config never depends on the environment of the process that reads it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional, Union

from megatron.bridge.training.errors import OverrideError, Violation, did_you_mean
from megatron.bridge.training.utils.typed_values import encode_plain, field_annotations

_ABSENT = object()
REFERENCE_FIX = "write the value itself, or ${section.field} to use another field's value (\\${ for a literal ${)"

_DOTTED_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class _ReferenceProblem(Exception):
    def __init__(self, message: str, fix: str = REFERENCE_FIX) -> None:
        super().__init__(message)
        self.message, self.fix = message, fix


class _DependsOnBadKey(Exception):
    """A reference to a key of the same layer that has its own problem (listed once, for that key)."""


@dataclass(frozen=True)
class _Reference:
    key: str


def split_references(text: str) -> list[Union[str, _Reference]]:
    """``'a${x.y}b'`` -> ``['a', _Reference('x.y'), 'b']``; ``\\${`` is a literal ``${``.

    Only references to a dotted key are read: a resolver (``${oc.env:HOME}``), a relative or nested
    reference, or an unclosed ``${`` raise :class:`_ReferenceProblem`.
    """
    parts: list[Union[str, _Reference]] = []
    literal: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("\\${", i):
            literal.append("${")
            i += 3
            continue
        if not text.startswith("${", i):
            literal.append(text[i])
            i += 1
            continue
        end = text.find("}", i + 2)
        if end < 0:
            raise _ReferenceProblem("an unclosed ${ (a reference is ${section.field})")
        inner = text[i + 2:end].strip()
        if "${" in inner or "{" in inner:
            raise _ReferenceProblem("nested references (${a.${b}}) are not read")
        if ":" in inner:
            resolver = inner.partition(":")[0]
            raise _ReferenceProblem(
                f"${{{inner}}} calls the resolver {resolver!r}: resolvers (oc.env, oc.decode, ...) are not "
                "evaluated, so a config never depends on the environment of the process that reads it",
                "write the value itself (a shell can put a variable in: key=\"$VAR\")",
            )
        if not _DOTTED_KEY.fullmatch(inner):
            raise _ReferenceProblem(
                f"${{{inner}}} is not a reference to a field (relative references such as ${{.x}} are not read)",
                "write the full dotted key, e.g. ${model.num_layers}",
            )
        parts.append("".join(literal))
        literal = []
        parts.append(_Reference(inner))
        i = end + 1
    parts.append("".join(literal))
    return [p for p in parts if p != ""]


def has_reference_syntax(value: Any) -> bool:
    """Whether a parsed value holds ``${`` anywhere (a string, or inside a list or mapping)."""
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, Mapping):
        return any(has_reference_syntax(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(has_reference_syntax(v) for v in value)
    return False


def check_reference_syntax(value: Any) -> Optional[_ReferenceProblem]:
    """The first problem of the ``${...}`` in ``value`` (resolvers, nesting...), without resolving."""
    if isinstance(value, str) and "${" in value:
        try:
            split_references(value)
        except _ReferenceProblem as problem:
            return problem
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return next(filter(None, map(check_reference_syntax, value)), None)
    return None


class _References:
    """Resolves the ``${a.b}`` of one layer: a key the layer sets gives the layer's value, any other
    key the config's value before the layer."""

    def __init__(self, cfg: Any, changes: Mapping[str, Any]) -> None:
        self.cfg, self.changes = cfg, changes
        self.failed: set[str] = set()

    def _in_layer(self, key: str) -> Any:
        node: Any = self.changes
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return _ABSENT
            node = node[part]
        return node

    def _in_config(self, key: str) -> Any:
        node, walked = self.cfg, ""
        for part in key.split("."):
            if dataclasses.is_dataclass(node) and not isinstance(node, type):
                names = list(field_annotations(type(node)))
                if part not in names:
                    where = f"{walked}." if walked else ""
                    raise _ReferenceProblem(
                        f"${{{key}}} names no field ({where}{part} is not one)",
                        did_you_mean(part, names, where) or "check the spelling of the dotted key",
                    )
                node = getattr(node, part)
            elif isinstance(node, Mapping) and part in node:
                node = node[part]
            else:
                raise _ReferenceProblem(f"${{{key}}} names no field ({walked} holds no keys)")
            walked = f"{walked}.{part}" if walked else part
        if dataclasses.is_dataclass(node) and not isinstance(node, type):
            raise _ReferenceProblem(f"${{{key}}} names a whole section, not a value", "name one field of it")
        try:
            return encode_plain(node)
        except OverrideError:
            raise _ReferenceProblem(f"${{{key}}} holds a value with no text form ({node!r})") from None

    def value(self, key: str, stack: tuple[str, ...]) -> Any:
        """The value ``${key}`` stands for."""
        if key in stack:
            raise _ReferenceProblem("a reference cycle: " + " -> ".join((*stack, key)), "break the cycle")
        if key in self.failed:
            raise _DependsOnBadKey(key)
        raw = self._in_layer(key)
        if raw is _ABSENT:
            return self._in_config(key)
        if isinstance(raw, Mapping):
            raise _ReferenceProblem(f"${{{key}}} names a whole section, not a value", "name one field of it")
        return self.resolve(raw, (*stack, key))

    def resolve(self, raw: Any, stack: tuple[str, ...]) -> Any:
        """``raw`` with its references replaced (a whole-string reference keeps the value's type)."""
        if isinstance(raw, (list, tuple)):
            return [self.resolve(v, stack) for v in raw]
        if isinstance(raw, Mapping):
            return {k: self.resolve(v, stack) for k, v in raw.items()}
        if not isinstance(raw, str) or "${" not in raw:
            return raw
        parts = split_references(raw)
        if len(parts) == 1 and isinstance(parts[0], _Reference):
            return self.value(parts[0].key, stack)
        return "".join(str(self.value(p.key, stack)) if isinstance(p, _Reference) else p for p in parts)


def resolve_references(cfg: Any, changes: Mapping[str, Any]) -> tuple[dict[str, Any], list[Violation]]:
    """``changes`` (a nested layer of overrides for ``cfg``) with every ``${a.b}`` replaced, and a
    problem for each key whose references cannot be read (those keys are left out)."""
    refs = _References(cfg, changes)
    errors: list[Violation] = []

    def walk(node: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, raw in node.items():
            dotted = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(raw, Mapping):
                out[key] = walk(raw, dotted)
                continue
            if not has_reference_syntax(raw):
                out[key] = raw
                continue
            try:
                out[key] = refs.resolve(raw, (dotted,))
            except _DependsOnBadKey:
                refs.failed.add(dotted)
            except _ReferenceProblem as problem:
                refs.failed.add(dotted)
                errors.append(Violation("override-reference", (dotted,), (raw,), problem.message, problem.fix,
                                        value_label="given"))
        return out

    # a key's own problem is found before a reference to it is followed, whatever their order
    for dotted, problem in _syntax_problems(changes, ""):
        refs.failed.add(dotted)
        errors.append(Violation("override-reference", (dotted,), (_value_at(changes, dotted),), problem.message,
                                problem.fix, value_label="given"))
    failed_first = set(refs.failed)
    resolved = walk(_without(changes, failed_first), "")
    return resolved, errors


def _syntax_problems(node: Mapping[str, Any], prefix: str) -> list[tuple[str, _ReferenceProblem]]:
    found = []
    for key, raw in node.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(raw, Mapping):
            found += _syntax_problems(raw, dotted)
        elif (problem := check_reference_syntax(raw)) is not None:
            found.append((dotted, problem))
    return found


def _value_at(node: Mapping[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        node = node[part]
    return node


def _without(node: Mapping[str, Any], dotted_keys: set[str], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, raw in node.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if dotted in dotted_keys:
            continue
        out[key] = _without(raw, dotted_keys, dotted) if isinstance(raw, Mapping) else raw
    return out
