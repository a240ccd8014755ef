"""Type-directed conversion of one parsed value (YAML/CLI) to a dataclass field's annotation.

omegaconf parses the text; the field annotations decide what a value becomes: ``=1`` on a bool
field is a real ``True``, ``abc`` on an int field is a mismatch that names the expected type, the
string ``"None"`` stays a string (only YAML's null means ``None``). Text for a callable field names
a function on that field's list (activation functions from torch and megatron-core, torch's init
methods; :data:`CONFIG_CALLABLES`): a config file cannot make the run import anything else.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Callable as AbcCallable
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

import torch

from megatron.bridge.training.errors import OverrideError, Violation

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


@dataclass(frozen=True)
class CallableKind:
    """The functions a config file (YAML or a dotted override) may name for one kind of field.

    Text never imports anything else: a name outside these modules is refused before any import.
    """

    label: str
    modules: tuple[str, ...]
    """Every public function defined in (or exposed by torch's C core through) these modules."""
    names: tuple[str, ...] = ()
    """Single functions of other modules, by import path."""

    def candidates(self, text: str) -> list[str]:
        """Import paths ``text`` may stand for: itself when dotted, else the bare name in each module."""
        if "." in text:
            return [text]
        return [f"{m}.{text}" for m in self.modules] + [n for n in self.names if n.rpartition(".")[2] == text]

    def allows(self, path: str) -> bool:
        """Whether ``path`` is in this kind's list, decided from the text alone (nothing imported)."""
        module, _, attr = path.rpartition(".")
        return path in self.names or (module in self.modules and bool(attr) and not attr.startswith("_"))

    def describe(self) -> str:
        """The allowed list as an error message shows it."""
        return ", ".join([f"{m}.*" for m in self.modules] + list(self.names))


ACTIVATION_FUNCTIONS = CallableKind(
    "an activation function",
    ("torch.nn.functional", "megatron.core.activations"),
    ("torch.tanh", "torch.sigmoid", "torch.relu"),
)
INIT_METHODS = CallableKind("an init method", ("torch.nn.init",))

CONFIG_CALLABLES: dict[str, CallableKind] = {
    "activation_func": ACTIVATION_FUNCTIONS,
    "init_method": INIT_METHODS,
    "output_layer_init_method": INIT_METHODS,
    "embedding_init_method": INIT_METHODS,
}
"""Callable fields a config file may set, by field name, and what each may name. Every other
callable field (timers, gradient hooks, ...) is a run-time hook: set it in Python."""

ANY_CONFIG_CALLABLE = CallableKind(
    "a function a config may name",
    ACTIVATION_FUNCTIONS.modules + INIT_METHODS.modules,
    ACTIVATION_FUNCTIONS.names + INIT_METHODS.names,
)
"""What a callable value may name when the field is not known (``convert_value`` without a name)."""


class CallableNotAllowed(Mismatch):
    """Text names a function outside the list for its field (or a field no config file may set)."""

    def __init__(self, expected: str, allowed: str) -> None:
        super().__init__(expected)
        self.allowed = allowed


def _defined_in(obj: Any, module: str) -> bool:
    """Defined in ``module`` itself (or a torch C builtin it exposes), not imported into it."""
    origin = getattr(obj, "__module__", None) or ""
    return origin == module or origin.startswith("torch._C")


def resolve_config_callable(text: str, name: str | None = None) -> Callable:
    """The function ``text`` names for the callable field ``name``, if that field's list allows it.

    ``text`` is an import path (``torch.nn.functional.silu``) or a bare name looked up in the
    allowed modules (``silu``). Nothing outside the list is imported.
    """
    kind = CONFIG_CALLABLES.get(name) if name is not None else ANY_CONFIG_CALLABLE
    if kind is None:
        raise CallableNotAllowed(f"nothing from a config file ({name} is a run-time hook: set it in Python)", "none")
    for path in kind.candidates(text.strip()):
        if not kind.allows(path):
            continue
        try:
            obj = import_object(path)
        except (ImportError, AttributeError):
            continue
        module = path.rpartition(".")[0]
        if inspect.isroutine(obj) and (path in kind.names or _defined_in(obj, module)):
            return obj
    raise CallableNotAllowed(f"{kind.label} from the allowed list", kind.describe())


def config_text_of_callable(fn: Callable) -> str | None:
    """The import path a config file writes for ``fn`` when it is on an allowed list (the public
    path, e.g. ``torch.nn.functional.gelu`` for a function torch defines in its C core)."""
    name = getattr(fn, "__name__", None)
    if not name:
        return None
    for path in ANY_CONFIG_CALLABLE.names:
        if path.rpartition(".")[2] == name and import_object(path) is fn:
            return path
    for module in ANY_CONFIG_CALLABLE.modules:
        mod = sys.modules.get(module)
        if mod is not None and getattr(mod, name, None) is fn and _defined_in(fn, module):
            return f"{module}.{name}"
    return None


def encode_plain(value: Any) -> Any:
    """A YAML-safe form of one value that is not a config dataclass: dtypes and enums as their
    names, callables as their import path (``OverrideError`` for one with no such path)."""
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [encode_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): encode_plain(v) for k, v in value.items()}
    if callable(value) and not isinstance(value, type):
        return callable_path(value)
    return value


def callable_path(fn: Callable) -> str:
    """The import path a config writes for ``fn``: its allowed-list name, else its module path."""
    listed = config_text_of_callable(fn)
    if listed is not None:
        return listed
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module and qualname and "<" not in qualname:
        path = f"{module}.{qualname}"
        try:
            if import_object(path) is fn:
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


def convert_value(value: Any, annotation: Any, name: str | None = None) -> Any:
    """Convert ``value`` (as parsed from YAML/CLI) to ``annotation``; raise ``Mismatch`` if it can't.

    ``name`` is the field's name: text for a callable field must name a function on that field's
    list (:data:`CONFIG_CALLABLES`; :class:`CallableNotAllowed` otherwise).
    """
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
                return convert_value(value, arm, name)
            except CallableNotAllowed:
                raise
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
            return resolve_config_callable(value, name)
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
            annotation = Optional[annotation]  # noqa: UP045 (Optional takes any type form at run time)
        result[f.name] = annotation
    return result


def dataclass_in(annotation: Any) -> type | None:
    """The dataclass type inside ``annotation`` (``X`` or ``X | None``), if any."""
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return annotation
    if typing.get_origin(annotation) in (Union, types.UnionType):
        found = [a for a in typing.get_args(annotation) if dataclasses.is_dataclass(a) and isinstance(a, type)]
        return found[0] if len(found) == 1 else None
    return None


def _allows_none(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (Union, types.UnionType) and type(None) in typing.get_args(annotation)
