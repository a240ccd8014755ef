"""Typed YAML and dotted-override handling for ``ConfigContainer``, built on omegaconf.

omegaconf parses the text (YAML files, ``a.b.c=value`` dotlists, ``${...}`` interpolation); the
dataclass field annotations decide what each value becomes. So ``model.num_layers=abc`` is an error
that names the key, the value and the expected type instead of a string that fails an hour later,
and ``=1`` on a bool field is a real ``True``.

Every entry point works on a copy and returns it: on error the caller's config is unchanged, and
all problems are reported together in one :class:`OverrideError`.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import enum
import importlib
import types
import typing
from collections.abc import Callable as AbcCallable
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Union

import torch
import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from megatron.bridge.training.errors import OverrideError, Violation

if typing.TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

TARGET_KEY = "_target_"
"""YAML key recording the class of a sub-config whose runtime class is a subclass (model providers)."""

_BOOL_WORDS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}
_DTYPES = {
    name: dtype
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64)
    for name in (str(dtype), str(dtype).removeprefix("torch."))
}
_DTYPES.update({"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "half": torch.float16})


class _Mismatch(Exception):
    """A value does not fit a type; carries the expected-type text for the error message."""

    def __init__(self, expected: str) -> None:
        super().__init__(expected)
        self.expected = expected


# --------------------------------------------------------------------------------------------
# Type-directed conversion of one value
# --------------------------------------------------------------------------------------------


def type_name(annotation: Any) -> str:
    """Readable name of an annotation for error messages."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "null"
    if origin is not None:
        return str(annotation).replace("typing.", "")
    return getattr(annotation, "__name__", str(annotation))


def _import_object(path: str) -> Any:
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ImportError(path)
    obj: Any = importlib.import_module(module_name)
    return getattr(obj, attr)


def _resolve_callable(text: str) -> Callable:
    """``torch.nn.functional.silu`` (an import path) or a bare name from ``torch.nn.functional``."""
    candidates = [text] if "." in text else [f"torch.nn.functional.{text}", f"torch.{text}"]
    for path in candidates:
        try:
            obj = _import_object(path)
        except (ImportError, AttributeError):
            continue
        if callable(obj):
            return obj
    raise _Mismatch("an importable callable such as torch.nn.functional.silu")


def convert_value(value: Any, annotation: Any) -> Any:
    """Convert ``value`` (as parsed from YAML/CLI) to ``annotation``; raise ``_Mismatch`` if it can't."""
    if annotation is Any or annotation is typing.Any:
        return value
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)

    if origin in (Union, types.UnionType):
        # Only YAML's null means None: the string "None" is not a sentinel (it stays a string).
        if value is None:
            if type(None) in args:
                return None
            raise _Mismatch(type_name(annotation))
        for arm in (a for a in args if a is not type(None)):
            try:
                return convert_value(value, arm)
            except _Mismatch:
                continue
        raise _Mismatch(type_name(annotation))
    if value is None:
        raise _Mismatch(f"{type_name(annotation)} (null is not allowed here)")
    if origin is Literal:
        for choice in args:
            try:
                if convert_value(value, type(choice)) == choice:
                    return choice
            except _Mismatch:
                continue
        raise _Mismatch(type_name(annotation))
    if origin in (list, tuple, Sequence) or annotation in (list, tuple):
        return _convert_sequence(value, origin or annotation, args)
    if origin in (dict, Mapping) or annotation is dict:
        if not isinstance(value, Mapping):
            raise _Mismatch(type_name(annotation))
        key_t, val_t = args if args else (Any, Any)
        return {convert_value(k, key_t): convert_value(v, val_t) for k, v in value.items()}
    if origin is AbcCallable or annotation is AbcCallable or annotation is typing.Callable:
        if callable(value) and not isinstance(value, str):
            return value
        if isinstance(value, str):
            return _resolve_callable(value)
        raise _Mismatch("an importable callable such as torch.nn.functional.silu")
    if isinstance(annotation, type):
        return _convert_scalar(value, annotation)
    return value


def _convert_sequence(value: Any, container: Any, args: tuple) -> Any:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise _Mismatch(f"a list ({type_name(container)})")
    if container in (tuple,) and args and (len(args) != 2 or args[1] is not Ellipsis):
        if len(args) != len(value):
            raise _Mismatch(f"a list of {len(args)} items")
        return tuple(convert_value(v, t) for v, t in zip(value, args))
    item_t = args[0] if args else Any
    items = [convert_value(v, item_t) for v in value]
    return tuple(items) if container is tuple else items


def _convert_scalar(value: Any, annotation: type) -> Any:
    if annotation is bool:
        if isinstance(value, bool):
            return value
        word = str(value).strip().lower() if isinstance(value, (str, int)) else None
        if word in _BOOL_WORDS:
            return _BOOL_WORDS[word]
        raise _Mismatch("bool (true/false/1/0)")
    if annotation is int:
        if isinstance(value, bool):
            raise _Mismatch("int")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        try:
            return int(str(value).strip())
        except ValueError:
            raise _Mismatch("int") from None
    if annotation is float:
        if isinstance(value, bool):
            raise _Mismatch("float")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise _Mismatch("float") from None
    if annotation is str:
        if isinstance(value, (Mapping, list, tuple)):
            raise _Mismatch("str")
        return str(value)
    if annotation is torch.dtype:
        if isinstance(value, torch.dtype):
            return value
        if str(value) in _DTYPES:
            return _DTYPES[str(value)]
        raise _Mismatch("a torch dtype such as torch.bfloat16")
    if issubclass(annotation, enum.Enum):
        if isinstance(value, annotation):
            return value
        for member in annotation:
            if str(value) in (member.name, str(member.value)):
                return member
        raise _Mismatch(f"one of {[m.name for m in annotation]}")
    if isinstance(value, annotation):
        return value
    raise _Mismatch(type_name(annotation))


# --------------------------------------------------------------------------------------------
# Dataclass trees
# --------------------------------------------------------------------------------------------


def field_annotations(cls: type) -> dict[str, Any]:
    """Resolved annotations of a dataclass's init fields (string annotations evaluated)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # some third-party annotations do not resolve; fall back per field
        hints = {}
    result = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        annotation = hints.get(f.name, f.type)
        if isinstance(annotation, str):
            annotation = Any
        elif f.default is None and not _allows_none(annotation) and annotation is not Any:
            # Some third-party fields default to None without saying Optional; None stays legal.
            annotation = Optional[annotation]
        result[f.name] = annotation
    return result


def _dataclass_in(annotation: Any) -> Optional[type]:
    """The dataclass type inside ``annotation`` (``X`` or ``Optional[X]``), if any."""
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return annotation
    if typing.get_origin(annotation) in (Union, types.UnionType):
        found = [a for a in typing.get_args(annotation) if dataclasses.is_dataclass(a)]
        return found[0] if len(found) == 1 else None
    return None


def _allows_none(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (Union, types.UnionType) and type(None) in typing.get_args(
        annotation
    )


def _plain(node: Any) -> Any:
    """omegaconf containers -> plain Python containers."""
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    return node


def _suggest(key: str, choices: Sequence[str], prefix: str) -> str:
    """Closest valid dotted keys at the same level, for unknown-key errors."""
    close = difflib.get_close_matches(key, choices, n=3, cutoff=0.6)
    if not close:
        return f"check the spelling; valid keys here: {', '.join(sorted(choices)[:12])}, ..."
    return "did you mean " + ", ".join(f"{prefix}{c}" for c in close) + "?"


def _class_from_target(target: Any, base: type, path: str, errors: list[Violation]) -> Optional[type]:
    try:
        cls = _import_object(str(target))
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


def _apply_tree(
    obj: Any,
    changes: Mapping[str, Any],
    path: str,
    source: str,
    errors: list[Violation],
    provenance: dict[str, str],
) -> Any:
    """Return ``obj`` rebuilt with ``changes``; dataclasses are re-created so their checks re-run."""
    cls = type(obj)
    if TARGET_KEY in changes:
        target_cls = _class_from_target(changes[TARGET_KEY], _declared_base(cls), path, errors)
        if target_cls is not None and target_cls is not cls:
            obj, cls = _retarget(obj, target_cls), target_cls
    annotations = field_annotations(cls)
    updates: dict[str, Any] = {}
    for key, raw in changes.items():
        if key == TARGET_KEY:
            continue
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
        sub_cls = _dataclass_in(annotation)
        current = getattr(obj, key)
        if sub_cls is not None and isinstance(raw, Mapping):
            base = current if current is not None else _default_instance(sub_cls, dotted, errors)
            if base is not None:
                updates[key] = _apply_tree(base, raw, dotted, source, errors, provenance)
            continue
        try:
            updates[key] = convert_value(raw, annotation)
        except _Mismatch as mismatch:
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
        provenance[dotted] = source
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


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


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
    return _plain(OmegaConf.from_dotlist(list(overrides)))


def apply_overrides(
    cfg: "ConfigContainer",
    overrides: Union[Mapping[str, Any], Sequence[str]],
    source: str = "cli",
) -> "ConfigContainer":
    """A copy of ``cfg`` with ``overrides`` (nested mapping or dotted strings) applied, typed.

    Every accepted leaf is recorded in ``provenance`` under ``source``. Raises ``OverrideError``
    listing every problem; ``cfg`` itself is never modified.
    """
    changes = parse_dotlist(overrides) if not isinstance(overrides, Mapping) else _plain(overrides)
    errors: list[Violation] = []
    provenance = dict(cfg.provenance)
    changes = {k: v for k, v in changes.items() if k != "provenance"}
    result = _apply_tree(copy.deepcopy(cfg), changes, "", source, errors, provenance)
    if errors:
        raise OverrideError(errors, f"invalid {source} overrides")
    return dataclasses.replace(result, provenance=provenance)


def process_config_with_overrides(
    cfg: "ConfigContainer",
    config_filepath: Optional[Union[str, Path]] = None,
    cli_overrides: Optional[Sequence[str]] = None,
) -> "ConfigContainer":
    """Apply a YAML file first, then dotted CLI overrides; return the updated copy of ``cfg``."""
    if config_filepath is not None:
        cfg = apply_overrides(cfg, load_yaml(config_filepath), source="yaml")
    if cli_overrides:
        cfg = apply_overrides(cfg, list(cli_overrides), source="cli")
    return cfg


def _yaml_violation(path: Path, exc: Exception) -> Violation:
    """A malformed YAML file as one violation: where (line, column) and what the parser says."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return Violation(
        "yaml-syntax",
        ("config_file",),
        (str(path),),
        f"not valid YAML{where}: {problem}",
        "fix the file there (indentation, a missing ':' after a key, an unclosed quote or bracket, "
        "a key given twice); check it with: uv run python -c \"import yaml,sys; "
        "yaml.safe_load(open(sys.argv[1]))\" FILE",
    )


def load_yaml(path: Union[str, Path]) -> dict[str, Any]:
    """A YAML file as a plain dict (interpolations resolved); a clear error when it is not a mapping."""
    path = Path(path)
    if not path.is_file():
        raise OverrideError(
            [Violation("yaml-missing", ("config_file",), (str(path),), "file not found", "check the path")],
            "cannot load YAML",
        )
    try:
        data = _plain(OmegaConf.load(path))
    except (yaml.YAMLError, OmegaConfBaseException) as exc:
        raise OverrideError([_yaml_violation(path, exc)], "cannot load YAML") from None
    if not isinstance(data, dict):
        raise OverrideError(
            [
                Violation(
                    "yaml-not-mapping",
                    ("config_file",),
                    (str(path),),
                    "the YAML file must hold a mapping of config sections",
                    "write e.g. 'model:\\n  num_layers: 4'",
                )
            ],
            "cannot load YAML",
        )
    return data


def _encode(value: Any) -> Any:
    """A YAML-safe form of one value (dtypes, enums, callables as text)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return config_to_dict(value)
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _encode(v) for k, v in value.items()}
    if callable(value) and not isinstance(value, type):
        return _callable_path(value)
    return value


def _callable_path(fn: Callable) -> str:
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module and qualname and "<" not in qualname:
        path = f"{module}.{qualname}"
        try:
            if _import_object(path) is fn:
                return path
        except (ImportError, AttributeError):
            pass
    raise OverrideError(
        [
            Violation(
                "yaml-callable",
                ("callable",),
                (repr(fn),),
                "only importable module-level functions can be written to YAML",
                "use a named function (e.g. torch.nn.functional.silu) instead of a lambda/partial",
            )
        ],
        "cannot serialize config",
    )


def config_to_dict(obj: Any) -> dict[str, Any]:
    """Init fields of a dataclass tree as plain data; model providers carry ``_target_``."""
    from megatron.bridge.models.gpt_provider import GPTModelProvider

    data: dict[str, Any] = {}
    if isinstance(obj, GPTModelProvider):
        data[TARGET_KEY] = f"{type(obj).__module__}.{type(obj).__qualname__}"
    for name in field_annotations(type(obj)):
        data[name] = _encode(getattr(obj, name))
    return data


def config_to_yaml(cfg: "ConfigContainer", path: Optional[Union[str, Path]] = None) -> str:
    """YAML text of ``cfg`` (written to ``path`` when given); loads back equal via ``config_from_yaml``."""
    text = OmegaConf.to_yaml(OmegaConf.create(config_to_dict(cfg)))
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    return text


def config_from_yaml(path: Union[str, Path]) -> "ConfigContainer":
    """Rebuild a ``ConfigContainer`` from a YAML file written by :func:`config_to_yaml`."""
    return config_from_dict(load_yaml(path))


def config_from_dict(data: Mapping[str, Any]) -> "ConfigContainer":
    """Rebuild a ``ConfigContainer`` from :func:`config_to_dict` output (typed, all errors at once)."""
    from megatron.bridge.models.gpt_provider import GPTModelProvider
    from megatron.bridge.training.config import ConfigContainer

    model_data = dict(data.get("model") or {})
    errors: list[Violation] = []
    model_cls = GPTModelProvider
    if TARGET_KEY in model_data:
        model_cls = _class_from_target(model_data.pop(TARGET_KEY), GPTModelProvider, "model", errors) or model_cls
    if errors:
        raise OverrideError(errors, "invalid YAML config")
    base = ConfigContainer(model=model_cls())
    saved_provenance = dict(data.get("provenance") or {})
    rest = {k: v for k, v in data.items() if k not in ("model", "provenance")}
    result = apply_overrides(base, {"model": model_data, **rest}, source="yaml")
    return dataclasses.replace(result, provenance=saved_provenance)


def describe_field_type(cls: type, name: str) -> str:
    """Readable expected type of ``cls.name`` (used by docs and the harness's help)."""
    return type_name(field_annotations(cls)[name])


__all__ = [
    "OverrideError",
    "apply_overrides",
    "config_from_dict",
    "config_from_yaml",
    "config_to_dict",
    "config_to_yaml",
    "convert_value",
    "load_yaml",
    "parse_dotlist",
    "process_config_with_overrides",
]
