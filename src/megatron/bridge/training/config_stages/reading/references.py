"""``${section.field}`` references in overrides and config files: what they mean, resolved here.

A reference names one field by its full dotted key and stands for that field's value: the value the
same layer (one YAML file, or one command line of overrides) gives it, else the config's value
before the layer. A whole-string reference keeps the value's type; inside text it is the value's
text. ``\\${`` is a literal ``${``. Resolvers (``${oc.env:...}`` and the like), relative and nested
references are refused: a config never depends on the environment of the process that reads it.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from megatron.bridge.training.config_stages.reading.shown import short_text, shown
from megatron.bridge.training.config_stages.reading.typed_values import encode_plain, field_annotations
from megatron.bridge.training.errors import OverrideError, Violation, did_you_mean

_ABSENT = object()
REFERENCE_FIX = "write the value itself, or ${section.field} to use another field's value (\\${ for a literal ${)"

MAX_REFERENCE_CHAIN = 16
"""References a value may go through in a row (``a=${b}`` and ``b=${c}`` make two)."""
MAX_EXPANDED_CHARS = 8192
"""The most characters a value made of references may have (twice the longest path Linux opens):
without a bound, each line ``k{i}=${k{i+1}}${k{i+1}}`` would double the value and the time."""
_CHAIN_FIX = "refer to the field that holds the value (the last one of the chain), or write the value itself"

_DOTTED_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class _ReferenceProblem(Exception):
    def __init__(self, message: str, fix: str = REFERENCE_FIX, rule: str = "override-reference") -> None:
        super().__init__(message)
        self.message, self.fix, self.rule = message, fix, rule


class _DependsOnBadKey(Exception):
    """A reference to a key of the same layer that has its own problem (listed once, for that key)."""


@dataclass(frozen=True)
class _Reference:
    key: str


def split_references(text: str) -> list[str | _Reference]:
    """``'a${x.y}b'`` -> ``['a', _Reference('x.y'), 'b']``; ``\\${`` is a literal ``${``.

    Only references to a dotted key are read: a resolver (``${oc.env:HOME}``), a relative or nested
    reference, or an unclosed ``${`` raise :class:`_ReferenceProblem`.
    """
    parts: list[str | _Reference] = []
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
        inner = text[i + 2 : end].strip()
        shown_inner = short_text(inner, 80)
        if "${" in inner or "{" in inner:
            raise _ReferenceProblem("nested references (${a.${b}}) are not read")
        if ":" in inner:
            resolver = inner.partition(":")[0]
            raise _ReferenceProblem(
                f"${{{shown_inner}}} calls the resolver {short_text(resolver, 40)!r}: resolvers (oc.env, oc.decode, "
                "...) are not evaluated, so a config never depends on the environment of the process that reads it",
                'write the value itself (a shell can put a variable in: key="$VAR")',
            )
        if not _DOTTED_KEY.fullmatch(inner):
            raise _ReferenceProblem(
                f"${{{shown_inner}}} is not a reference to a field (relative references such as ${{.x}} are not read)",
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


def check_reference_syntax(value: Any) -> _ReferenceProblem | None:
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
    key the config's value before the layer.

    Each key is resolved once (its value is kept), a key that cannot be resolved is listed once (in
    ``errors``) and the keys that refer to it are left out with it, so the work is linear in the
    layer's references; :data:`MAX_REFERENCE_CHAIN` and :data:`MAX_EXPANDED_CHARS` bound the rest."""

    def __init__(self, cfg: Any, changes: Mapping[str, Any], errors: list[Violation]) -> None:
        self.cfg, self.changes, self.errors = cfg, changes, errors
        self.failed: set[str] = set()
        self.done: dict[str, Any] = {}

    def fail(self, key: str, raw: Any, problem: _ReferenceProblem) -> None:
        """List ``problem`` for ``key`` (given as ``raw``); references to ``key`` fail with it."""
        self.failed.add(key)
        self.errors.append(
            Violation(
                problem.rule, (short_text(key),), (shown(raw),), problem.message, problem.fix, value_label="given"
            )
        )

    def _in_layer(self, key: str) -> Any:
        node: Any = self.changes
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return _ABSENT
            node = node[part]
        return node

    def _in_config(self, key: str) -> Any:
        node, walked, shown_key = self.cfg, "", short_text(key)
        for part in key.split("."):
            if dataclasses.is_dataclass(node) and not isinstance(node, type):
                names = list(field_annotations(type(node)))
                if part not in names:
                    where = f"{walked}." if walked else ""
                    raise _ReferenceProblem(
                        f"${{{shown_key}}} names no field ({where}{short_text(part)} is not one)",
                        did_you_mean(part, names, where) or "check the spelling of the dotted key",
                    )
                node = getattr(node, part)
            elif isinstance(node, Mapping) and part in node:
                node = node[part]
            else:
                raise _ReferenceProblem(f"${{{shown_key}}} names no field ({walked} holds no keys)")
            walked = f"{walked}.{part}" if walked else part
        if dataclasses.is_dataclass(node) and not isinstance(node, type):
            raise _ReferenceProblem(f"${{{shown_key}}} names a whole section, not a value", "name one field of it")
        try:
            return encode_plain(node)
        except OverrideError:
            raise _ReferenceProblem(f"${{{shown_key}}} holds a value with no text form ({shown(node)!r})") from None

    def value(self, key: str, stack: tuple[str, ...]) -> Any:
        """The value ``${key}`` stands for (``stack``: the keys being resolved that lead to it)."""
        if key in stack:
            cycle = " -> ".join(short_text(k, 60) for k in (*stack, key))
            raise _ReferenceProblem("a reference cycle: " + cycle, "break the cycle")
        if key in self.failed:
            raise _DependsOnBadKey(key)
        raw = self._in_layer(key)
        if raw is _ABSENT:
            return self._in_config(key)
        if isinstance(raw, Mapping):
            raise _ReferenceProblem(
                f"${{{short_text(key)}}} names a whole section, not a value", "name one field of it"
            )
        if len(stack) > MAX_REFERENCE_CHAIN:  # never reached: longer chains are refused before resolving
            raise _ReferenceProblem(
                f"more than {MAX_REFERENCE_CHAIN} references in a row", _CHAIN_FIX, "override-reference-depth"
            )
        return copy.deepcopy(self.resolved(key, raw, stack))  # each use its own copy, as a written value is

    def resolved(self, key: str, raw: Any, stack: tuple[str, ...] = ()) -> Any:
        """The value of the layer's ``key`` (written ``raw``) with its references replaced, resolved
        once; ``_DependsOnBadKey`` when it or a key it refers to has a problem (listed once)."""
        if key in self.failed:
            raise _DependsOnBadKey(key)
        if key in self.done:
            return self.done[key]
        try:
            value = self.resolve(raw, (*stack, key))
            if has_reference_syntax(raw) and _text_size(value) > MAX_EXPANDED_CHARS:
                raise _too_long()
        except _DependsOnBadKey:
            self.failed.add(key)
            raise
        except _ReferenceProblem as problem:
            self.fail(key, raw, problem)
            raise _DependsOnBadKey(key) from None
        self.done[key] = value
        return value

    def resolve(self, raw: Any, stack: tuple[str, ...]) -> Any:
        """``raw`` with its references replaced (a whole-string reference keeps the value's type); a
        list, mapping or text longer than :data:`MAX_EXPANDED_CHARS` is refused as it is built."""
        if isinstance(raw, (list, tuple)):
            spent = _Spent()
            return [spent.add(self.resolve(v, stack)) for v in raw]
        if isinstance(raw, Mapping):
            spent = _Spent()
            return {k: spent.add(self.resolve(v, stack)) for k, v in raw.items()}
        if not isinstance(raw, str) or "${" not in raw:
            return raw
        parts = split_references(raw)
        if len(parts) == 1 and isinstance(parts[0], _Reference):
            return self.value(parts[0].key, stack)
        spent = _Spent()
        return "".join(spent.add(str(self.value(p.key, stack)) if isinstance(p, _Reference) else p, 0) for p in parts)

    def refuse_long_chains(self, leaves: list[tuple[str, Any]]) -> None:
        """Before anything is resolved: list each key whose value goes through more than
        :data:`MAX_REFERENCE_CHAIN` references in a row, where the chain first gets too long; the
        keys that refer to it are left out with it (measured without recursion)."""
        lengths: dict[str, int] = {}
        raws = dict(leaves)
        for key, raw in leaves:
            if key not in lengths and key not in self.failed and has_reference_syntax(raw):
                self._measure(key, raw, lengths)
        for key, length in lengths.items():
            if length == MAX_REFERENCE_CHAIN + 1:
                chain = " -> ".join(short_text(k, 60) for k in self._longest_chain(key, lengths))
                self.fail(
                    key,
                    raws.get(key, self._in_layer(key)),
                    _ReferenceProblem(
                        f"its value goes through {length} references in a row ({chain}); at most "
                        f"{MAX_REFERENCE_CHAIN} are followed (keys that refer to it are left out with it)",
                        _CHAIN_FIX,
                        "override-reference-depth",
                    ),
                )
        self.failed.update(key for key, length in lengths.items() if length > MAX_REFERENCE_CHAIN)

    def _layer_leaf(self, key: str) -> Any:
        """The value the layer writes for ``key`` when it is one to follow (not a section, not failed)."""
        raw = self._in_layer(key)
        return _ABSENT if isinstance(raw, Mapping) or key in self.failed else raw

    def _measure(self, start: str, raw: Any, lengths: dict[str, int]) -> None:
        """``lengths[key]``: the most references in a row from ``key`` (a config value ends a chain),
        for ``start`` and every key of the layer it reaches; a cycle is cut here (listed when resolving)."""
        on_path = {start}
        stack = [(start, _referenced_keys(raw), 0)]
        while stack:
            key, refs, i = stack.pop()
            if i == len(refs):
                on_path.discard(key)
                lengths[key] = max((1 + lengths.get(r, 0) for r in refs), default=0)
                continue
            stack.append((key, refs, i + 1))
            ref = refs[i]
            ref_raw = _ABSENT if ref in lengths or ref in on_path else self._layer_leaf(ref)
            if ref_raw is not _ABSENT:
                on_path.add(ref)
                stack.append((ref, _referenced_keys(ref_raw), 0))

    def _longest_chain(self, key: str, lengths: dict[str, int]) -> list[str]:
        """``key`` and the keys of its longest chain of references, in order."""
        chain = [key]
        while len(chain) <= MAX_REFERENCE_CHAIN + 1:
            refs = _referenced_keys(self._in_layer(chain[-1]))
            if not refs:
                break
            chain.append(max(refs, key=lambda r: lengths.get(r, 0)))
        return chain


class _Spent:
    """The size of a value being built from parts, refused once it passes :data:`MAX_EXPANDED_CHARS`."""

    def __init__(self) -> None:
        self.size = 0

    def add(self, part: Any, separator: int = 2) -> Any:
        """``part``, counted with its ``separator`` (``_ReferenceProblem`` once the parts so far are too long)."""
        self.size += _text_size(part) + separator
        if self.size > MAX_EXPANDED_CHARS:
            raise _too_long()
        return part


def _too_long() -> _ReferenceProblem:
    return _ReferenceProblem(
        f"its references make it longer than {MAX_EXPANDED_CHARS:,} characters (the most a value made of "
        "references may be, so that a config cannot grow without bound)",
        "write the value itself, or refer to fewer or shorter fields",
        "override-reference-size",
    )


def _referenced_keys(raw: Any) -> list[str]:
    """Every key ``raw`` names in a ``${...}`` (in a string, or inside a list or mapping), once each."""
    if isinstance(raw, str):
        keys = [p.key for p in split_references(raw) if isinstance(p, _Reference)] if "${" in raw else []
    elif isinstance(raw, (list, tuple, Mapping)):
        keys = [key for item in (raw.values() if isinstance(raw, Mapping) else raw) for key in _referenced_keys(item)]
    else:
        keys = []
    return list(dict.fromkeys(keys))


def _text_size(value: Any) -> int:
    """About how many characters ``value`` takes as text, counted up to just past
    :data:`MAX_EXPANDED_CHARS` (a value that repeats one list many times is not walked whole)."""
    size, todo = 0, [value]
    while todo and size <= MAX_EXPANDED_CHARS:
        item = todo.pop()
        if isinstance(item, Mapping):
            size += 2 + sum(len(str(k)) + 2 for k in item)
            todo.extend(item.values())
        elif isinstance(item, (list, tuple)):
            size += 2 + 2 * len(item)
            todo.extend(item)
        else:
            size += len(str(item))
    return size


def _leaves(node: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``(dotted key, value)`` of every value of a nested layer that is not a mapping."""
    found = []
    for key, raw in node.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        found += _leaves(raw, dotted) if isinstance(raw, Mapping) else [(dotted, raw)]
    return found


def resolve_references(cfg: Any, changes: Mapping[str, Any]) -> tuple[dict[str, Any], list[Violation]]:
    """``changes`` (a nested layer of overrides for ``cfg``) with every ``${a.b}`` replaced, and a
    problem for each key whose references cannot be read (those keys, and the keys that refer to
    them, are left out)."""
    errors: list[Violation] = []
    refs = _References(cfg, changes, errors)

    def walk(node: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, raw in node.items():
            dotted = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(raw, Mapping):
                out[key] = walk(raw, dotted)
            elif not has_reference_syntax(raw):
                out[key] = raw
            else:
                try:
                    out[key] = refs.resolved(dotted, raw)
                except _DependsOnBadKey:
                    pass
        return out

    # a key's own problem is found before a reference to it is followed, whatever their order
    for dotted, problem in _syntax_problems(changes, ""):
        refs.fail(dotted, _value_at(changes, dotted), problem)
    refs.refuse_long_chains(_leaves(changes))
    return walk(_without(changes, set(refs.failed)), ""), errors


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
