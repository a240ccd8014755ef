"""The text of dotted overrides as plain data: ``key=value`` items read as YAML, every unreadable item
named with why and the fix.

Only reading: nothing here knows a config's fields (``overrides`` types the values against them) or
Hydra's ``+``/``++``/``~`` forms (``hydra_overrides``, which reads each value with :func:`parse_value`).
Every value passes :func:`~megatron.bridge.training.config_stages.reading.plain_yaml.plain_yaml_root`
first: a tag, an anchor or a key given twice is refused, so nothing read here runs code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from megatron.bridge.training.config_stages.reading.plain_yaml import PROBLEM_FIXES, NotPlainYaml, plain_yaml_root
from megatron.bridge.training.config_stages.reading.references import REFERENCE_FIX
from megatron.bridge.training.config_stages.reading.shown import short_text, shown
from megatron.bridge.training.errors import OverrideError, Violation


def plain(node: Any) -> Any:
    """omegaconf containers -> plain Python containers, ``${...}`` left as written (references are
    resolved against the config they are applied to: :func:`resolve_references`)."""
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=False)
    return node


_VALUE_FIX = (
    "write a plain YAML value: a number, true/false, null, a quoted string ('...'), a list [a, b] "
    "or a mapping {k: v}, with every quote and bracket closed (in a shell, put the whole override "
    "in double quotes: \"key='value'\")"
)


def value_problem(text: str, exc: Exception) -> tuple[str, str, str]:
    """The rule id, why the YAML value ``text`` could not be read, and the fix (a tag, a key given
    twice and a malformed ``${...}`` are named as such)."""
    if isinstance(exc, NotPlainYaml):
        fixes = dict.fromkeys(PROBLEM_FIXES[p.kind] for p in exc.problems)
        return "override-value-syntax", "; ".join(p.message for p in exc.problems), "; ".join(fixes)
    problem = short_text(getattr(exc, "problem", None) or str(exc).splitlines()[0])
    if isinstance(exc, OmegaConfBaseException) and "${" in text:
        return "override-reference", f"a ${{...}} that cannot be read ({problem})", REFERENCE_FIX
    return "override-value-syntax", f"not a valid YAML value: {problem}", _VALUE_FIX


def parse_value(text: str) -> Any:
    """One override value as YAML that is plain data (``plain_yaml``; omegaconf's reading of numbers;
    ``${...}`` kept as written); raises ``yaml.YAMLError`` (:class:`NotPlainYaml` for a tag, a key
    given twice, ...) or omegaconf's error when it cannot be read."""
    plain_yaml_root(text)
    return OmegaConf.to_container(OmegaConf.from_dotlist([f"v={text}"]), resolve=False)["v"]


def _set_nested(tree: dict[str, Any], key: str, value: Any) -> None:
    """``tree[a][b][c] = value`` for ``key='a.b.c'``; a mapping merges into a mapping already there."""
    *parents, leaf = key.split(".")
    node = tree
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    if isinstance(value, dict) and isinstance(node.get(leaf), dict):
        for k, v in value.items():
            _set_nested(node[leaf], k, v)
    else:
        node[leaf] = value


def read_dotlist(overrides: Sequence[str]) -> tuple[dict[str, Any], list[Violation]]:
    """``["a.b=1", "c=[1,2]"]`` -> nested dict and the problems of the items that could not be read
    (each named with its override and why); the readable items are all in the dict."""
    tree: dict[str, Any] = {}
    errors: list[Violation] = []
    for item in overrides:
        item = str(item)
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            errors.append(
                Violation(
                    "override-syntax",
                    (short_text(item),),
                    (shown(item),),
                    f"{shown(item)!r} is not a dotted override",
                    "write key.path=value, e.g. model.num_layers=4",
                    value_label="given",
                )
            )
            continue
        if not raw.strip():
            errors.append(
                Violation(
                    "override-empty-value",
                    (short_text(key),),
                    (raw,),
                    f'{short_text(key)}= gives no value (an unset shell variable, as in {short_text(key)}="$UNSET"?): '
                    "it would quietly mean null",
                    f"give the value, or write {short_text(key)}=null to unset it on purpose",
                    value_label="given",
                )
            )
            continue
        try:
            value = parse_value(raw)
        except (yaml.YAMLError, OmegaConfBaseException) as exc:
            rule, message, fix = value_problem(raw, exc)
            errors.append(
                Violation(
                    rule, (short_text(key),), (shown(raw),), f"{shown(item)!r}: {message}", fix, value_label="given"
                )
            )
            continue
        _set_nested(tree, key, value)
    return tree, errors


def parse_dotlist(overrides: Sequence[str]) -> dict[str, Any]:
    """``["a.b=1", "c=[1,2]"]`` -> nested dict, values read as YAML; ``OverrideError`` listing every
    item that could not be read."""
    tree, errors = read_dotlist(overrides)
    if errors:
        raise OverrideError(errors, "could not parse overrides")
    return tree
