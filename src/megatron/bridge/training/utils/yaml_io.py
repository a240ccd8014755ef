"""YAML in and out: load a YAML file, write a config tree, rebuild a container from plain data.

A written config loads back equal (``ConfigContainer.from_yaml``); dtypes, enums and importable
callables are written as text; model providers carry their class in ``_target_``.

Files are read with YAML's safe loading: a tag never builds a Python object. A ``_target_`` names
one of the project's provider classes and a callable field one function of its allowed list
(``overrides.allowed_targets``, ``typed_values.CONFIG_CALLABLES``); nothing else is imported.
``${section.field}`` references are kept as written here and resolved when the file is applied
to a config (``overrides.resolve_references``); resolvers such as ``${oc.env:...}`` are refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from megatron.bridge.models.gpt_provider import GPTModelProvider
from megatron.bridge.training.errors import ConfigFileNotFoundError, OverrideError, Violation
from megatron.bridge.training.resolution import ownership
from megatron.bridge.training.utils.overrides import (
    TARGET_KEY,
    class_from_target,
    is_container,
    plain,
    value_problem,
    with_overrides,
)
from megatron.bridge.training.utils.typed_values import encode_plain, field_annotations

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer


def _yaml_violation(path: Path, exc: Exception) -> Violation:
    """A malformed YAML file as one violation: where (line, column) and what the parser says."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if isinstance(exc, yaml.constructor.ConstructorError):
        _, _, fix = value_problem("", exc)
        message = f"a YAML tag{where} is not read ({problem}): values are plain data, nothing is built from a tag"
        return Violation("yaml-syntax", ("config_file",), (str(path),), message, fix)
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
    """A YAML file as a plain dict (safe loading; ``${...}`` kept as written, for the config it is
    applied to to resolve); a clear error when it is not a mapping."""
    path = Path(path)
    if not path.is_file():
        raise ConfigFileNotFoundError(
            [Violation("yaml-missing", ("config_file",), (str(path),), "config file not found",
                       "check the path (relative paths start at the working directory)")],
            "cannot load YAML",
        )
    try:
        data = plain(OmegaConf.load(path))
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


def encode_value(value: Any) -> Any:
    """A YAML-safe form of one value (config dataclasses as trees; dtypes, enums, callables as text)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return config_to_dict(value)
    if isinstance(value, (list, tuple)):
        return [encode_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): encode_value(v) for k, v in value.items()}
    return encode_plain(value)


def config_to_dict(obj: Any) -> dict[str, Any]:
    """Init fields of a dataclass tree as plain data; model providers carry ``_target_``.

    For a whole ``ConfigContainer`` the fields that are copies of another field are left out
    (:func:`ownership.copies_left_out_of_yaml`): a saved config holds the owners only.
    """
    data: dict[str, Any] = {}
    if isinstance(obj, GPTModelProvider):
        data[TARGET_KEY] = f"{type(obj).__module__}.{type(obj).__qualname__}"
    for name in field_annotations(type(obj)):
        data[name] = encode_value(getattr(obj, name))
    if is_container(obj):
        _leave_out_copies(obj, data)
    return data


def _leave_out_copies(cfg: Any, data: dict[str, Any]) -> None:
    for dotted in ownership.copies_left_out_of_yaml(cfg):
        section, _, name = dotted.rpartition(".")
        node = data.get(section)
        if isinstance(node, dict):
            node.pop(name, None)


def config_to_yaml(cfg: "ConfigContainer", path: Optional[Union[str, Path]] = None) -> str:
    """YAML text of ``cfg`` (written to ``path`` when given); loads back equal via ``config_from_yaml``."""
    text = OmegaConf.to_yaml(OmegaConf.create(_literal_dollars(config_to_dict(cfg))))
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    return text


def _literal_dollars(node: Any) -> Any:
    """Strings holding ``${`` written as ``\\${``, so that they load back as the same text, not as
    references."""
    if isinstance(node, str):
        return node.replace("${", "\\${")
    if isinstance(node, dict):
        return {k: _literal_dollars(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_literal_dollars(v) for v in node]
    return node


def container_from_dict(container_cls: type, data: Mapping[str, Any]) -> "ConfigContainer":
    """Rebuild a ``container_cls`` (a ``ConfigContainer``) from :func:`config_to_dict` output.

    Typed, every error at once; the saved provenance is restored as it was written.
    """
    model_data = dict(data.get("model") or {})
    errors: list[Violation] = []
    model_cls = GPTModelProvider
    if TARGET_KEY in model_data:
        model_cls = class_from_target(model_data.pop(TARGET_KEY), GPTModelProvider, "model", errors) or model_cls
    if errors:
        raise OverrideError(errors, "invalid YAML config")
    base = container_cls(model=model_cls())
    saved_provenance = dict(data.get("provenance") or {})
    rest = {k: v for k, v in data.items() if k not in ("model", "provenance")}
    result = with_overrides(base, {"model": model_data, **rest}, source="yaml")
    return dataclasses.replace(result, provenance=saved_provenance)
