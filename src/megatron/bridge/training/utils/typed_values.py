"""Type-directed conversion of one parsed value (YAML/CLI) to a dataclass field's annotation.

omegaconf parses the text; the field annotations decide what a value becomes: ``=1`` on a bool
field is a real ``True``, ``abc`` on an int field is a mismatch that names the expected type, the
string ``"None"`` stays a string (only YAML's null means ``None``).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import types
import typing
from collections.abc import Callable as AbcCallable
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Literal, Optional, Union

import torch

_BOOL_WORDS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}
_DTYPES = {
    name: dtype
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64)
    for name in (str(dtype), str(dtype).removeprefix("torch."))
}
_DTYPES.update({"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "half": torch.float16})


class Mismatch(Exception):
    """A value does not fit a type; carries the expected-type text for the error message."""

    def __init__(self, expected: str) -> None:
        super().__init__(expected)
        self.expected = expected


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


def import_object(path: str) -> Any:
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
            obj = import_object(path)
        except (ImportError, AttributeError):
            continue
        if callable(obj):
            return obj
    raise Mismatch("an importable callable such as torch.nn.functional.silu")


def convert_value(value: Any, annotation: Any) -> Any:
    """Convert ``value`` (as parsed from YAML/CLI) to ``annotation``; raise ``Mismatch`` if it can't."""
    if annotation is Any or annotation is typing.Any:
        return value
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)

    if origin in (Union, types.UnionType):
        # Only YAML's null means None: the string "None" is not a sentinel (it stays a string).
        if value is None:
            if type(None) in args:
                return None
            raise Mismatch(type_name(annotation))
        for arm in (a for a in args if a is not type(None)):
            try:
                return convert_value(value, arm)
            except Mismatch:
                continue
        raise Mismatch(type_name(annotation))
    if value is None:
        raise Mismatch(f"{type_name(annotation)} (null is not allowed here)")
    if origin is Literal:
        for choice in args:
            try:
                if convert_value(value, type(choice)) == choice:
                    return choice
            except Mismatch:
                continue
        raise Mismatch(type_name(annotation))
    if origin in (list, tuple, Sequence) or annotation in (list, tuple):
        return _convert_sequence(value, origin or annotation, args)
    if origin in (dict, Mapping) or annotation is dict:
        if not isinstance(value, Mapping):
            raise Mismatch(type_name(annotation))
        key_t, val_t = args if args else (Any, Any)
        return {convert_value(k, key_t): convert_value(v, val_t) for k, v in value.items()}
    if origin is AbcCallable or annotation is AbcCallable or annotation is typing.Callable:
        if callable(value) and not isinstance(value, str):
            return value
        if isinstance(value, str):
            return _resolve_callable(value)
        raise Mismatch("an importable callable such as torch.nn.functional.silu")
    if isinstance(annotation, type):
        return _convert_scalar(value, annotation)
    return value


def _convert_sequence(value: Any, container: Any, args: tuple) -> Any:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise Mismatch(f"a list ({type_name(container)})")
    if container in (tuple,) and args and (len(args) != 2 or args[1] is not Ellipsis):
        if len(args) != len(value):
            raise Mismatch(f"a list of {len(args)} items")
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
        raise Mismatch("bool (true/false/1/0)")
    if annotation is int:
        if isinstance(value, bool):
            raise Mismatch("int")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        try:
            return int(str(value).strip())
        except ValueError:
            raise Mismatch("int") from None
    if annotation is float:
        if isinstance(value, bool):
            raise Mismatch("float")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise Mismatch("float") from None
    if annotation is str:
        if isinstance(value, (Mapping, list, tuple)):
            raise Mismatch("str")
        return str(value)
    if annotation is torch.dtype:
        if isinstance(value, torch.dtype):
            return value
        if str(value) in _DTYPES:
            return _DTYPES[str(value)]
        raise Mismatch("a torch dtype such as torch.bfloat16")
    if issubclass(annotation, enum.Enum):
        if isinstance(value, annotation):
            return value
        for member in annotation:
            if str(value) in (member.name, str(member.value)):
                return member
        raise Mismatch(f"one of {[m.name for m in annotation]}")
    if isinstance(value, annotation):
        return value
    raise Mismatch(type_name(annotation))


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


def dataclass_in(annotation: Any) -> Optional[type]:
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


