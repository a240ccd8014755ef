"""YAML in and out: load a YAML file, write a config tree, rebuild a container from plain data.

A written config loads back equal (``ConfigContainer.from_yaml``); dtypes, enums and importable
callables are written as text; model providers carry their class in ``_target_``.

A config file is at most 1 MiB of UTF-8 YAML that is plain data (``plain_yaml``: no tag builds
anything, no key is given twice, aliases expand it to a bounded size); anything else is a listed
problem, never a traceback. A ``_target_`` names
one of the project's provider classes and a callable field one function of its allowed list
(``overrides.allowed_targets``, ``typed_values.CONFIG_CALLABLES``); nothing else is imported.
``${section.field}`` references are kept as written here and resolved when the file is applied
to a config (``overrides.resolve_references``); resolvers such as ``${oc.env:...}`` are refused.
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import io
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from megatron.bridge.models.gpt_provider import GPTModelProvider
from megatron.bridge.training.config_stages.facts import ownership
from megatron.bridge.training.config_stages.reading.override_text import plain
from megatron.bridge.training.config_stages.reading.overrides import (
    TARGET_KEY,
    class_from_target,
    is_container,
    with_overrides,
)
from megatron.bridge.training.config_stages.reading.plain_yaml import (
    PROBLEM_FIXES,
    NotPlainYaml,
    YamlProblem,
    plain_yaml_root,
)
from megatron.bridge.training.config_stages.reading.shown import short_text, shown
from megatron.bridge.training.config_stages.reading.typed_values import encode_plain, field_annotations
from megatron.bridge.training.errors import ConfigFileNotFoundError, OverrideError, Violation
from megatron.bridge.utils.owned_files import replace_file

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer


_CONFIG_FILE = ("config_file",)
_YAML_RULES = {"duplicate-key": "yaml-duplicate-key", "too-large": "yaml-too-large"}
"""Rule id of each kind of :class:`YamlProblem` in a file (the others are ``yaml-syntax``)."""
MAX_CONFIG_FILE_BYTES = 1 << 20
"""The largest config file read (a whole saved config is about 15 KB)."""
_NAME_MAX, _PATH_MAX = 255, 4096
"""Bytes of one name in a path and of a whole path that Linux file systems take."""


def _file_violation(path: Path, rule: str, message: str, fix: str) -> Violation:
    return Violation(rule, _CONFIG_FILE, (shown(str(path)),), message, fix)


def _cannot_load(violations: list[Violation]) -> OverrideError:
    return OverrideError(violations, "cannot load YAML")


def _plain_yaml_violation(path: Path, problem: YamlProblem) -> Violation:
    """One problem of a file that is YAML but not plain data, with its own rule and fix."""
    where = f"line {problem.line}, column {problem.column}"
    return _file_violation(
        path,
        _YAML_RULES.get(problem.kind, "yaml-syntax"),
        f"at {where}: {problem.message}",
        PROBLEM_FIXES[problem.kind],
    )


def _yaml_violation(path: Path, exc: Exception) -> Violation:
    """A malformed YAML file as one violation: where (line, column) and what the parser says."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return _file_violation(
        path,
        "yaml-syntax",
        f"not valid YAML{where}: {short_text(problem)}",
        "fix the file there (indentation, a missing ':' after a key, an unclosed quote or bracket); "
        'check it with: uv run python -c "import yaml,sys; yaml.safe_load(open(sys.argv[1]))" FILE',
    )


def _path_too_long(path: Path) -> Violation | None:
    """A path no file system opens (a name over 255 bytes, the whole over 4,095), said before it is tried."""
    longest = max((len(os.fsencode(part)) for part in path.parts), default=0)
    total = len(os.fsencode(str(path)))
    if longest <= _NAME_MAX and total < _PATH_MAX:
        return None
    what = (
        f"a name in it is {longest:,} bytes long (at most {_NAME_MAX})"
        if longest > _NAME_MAX
        else f"it is {total:,} bytes long (at most {_PATH_MAX - 1})"
    )
    return _file_violation(
        path,
        "yaml-path-too-long",
        f"the config file path cannot be opened: {what}",
        "check the path (an unquoted variable or a pasted text may have run into it)",
    )


def _not_utf8(data: bytes) -> str | None:
    """Why ``data`` is not UTF-8 text (a UTF-16/32 byte-order mark, NUL bytes, an invalid byte), or ``None``."""
    for name, bom in (
        ("UTF-32", codecs.BOM_UTF32_LE),
        ("UTF-32", codecs.BOM_UTF32_BE),
        ("UTF-16", codecs.BOM_UTF16_LE),
        ("UTF-16", codecs.BOM_UTF16_BE),
    ):
        if data.startswith(bom):
            return f"it is {name} text"
    nul = data.find(b"\0")
    if nul >= 0:
        return f"it holds NUL bytes (the first at byte {nul:,}): binary data, or UTF-16/32 text"
    try:
        data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return f"byte {exc.start:,} (0x{data[exc.start]:02x}) is not UTF-8"
    return None


def _unreadable(path: Path, exc: OSError) -> OverrideError:
    return _cannot_load(
        [
            _file_violation(
                path,
                "yaml-unreadable",
                f"cannot read the config file: {exc.strerror}",
                "check the path and its permissions",
            )
        ]
    )


def _check_regular_file(path: Path) -> None:
    """Refuse a path that is missing or not a regular file (a directory, a device, a pipe)."""
    try:
        info = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        info = None
    except OSError as exc:
        raise _unreadable(path, exc) from None
    if info is None or not stat.S_ISREG(info.st_mode):
        what = "Config file not found" if info is None else "the config file path is not a regular file"
        raise ConfigFileNotFoundError(
            [
                _file_violation(
                    path, "yaml-missing", what, "check the path (relative paths start at the working directory)"
                )
            ],
            "cannot load YAML",
        )


def _bounded_bytes(path: Path) -> bytes:
    """The file's bytes, read no further than :data:`MAX_CONFIG_FILE_BYTES` (a larger file is refused)."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_CONFIG_FILE_BYTES + 1)
    except OSError as exc:
        raise _unreadable(path, exc) from None
    if len(data) > MAX_CONFIG_FILE_BYTES:
        raise _cannot_load(
            [
                _file_violation(
                    path,
                    "yaml-too-large",
                    f"the config file is over {MAX_CONFIG_FILE_BYTES // 1024:,} KiB",
                    "a config file sets fields: check that this is the file meant",
                )
            ]
        )
    return data


def _config_text(path: Path, sha256: str | None = None) -> str:
    """The text of a config file: a regular file of at most 1 MiB of UTF-8 (with ``sha256``, exactly
    the file of that digest), else a listed problem."""
    problem = _path_too_long(path)
    if problem is not None:
        raise _cannot_load([problem])
    _check_regular_file(path)
    data = _bounded_bytes(path)
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise _cannot_load(
            [
                _file_violation(
                    path,
                    "config-file-is-the-one-written",
                    "the config file is not the one the harness wrote for this run (its SHA-256 differs): something "
                    "replaced or changed it after the launch, so these ranks would train another configuration",
                    "launch again; keep the run directory to this run (another harness, or a user with write access "
                    "to it, changed the file)",
                )
            ]
        )
    why = _not_utf8(data)
    if why is not None:
        raise _cannot_load(
            [
                _file_violation(
                    path,
                    "yaml-not-utf8",
                    f"the config file is not UTF-8 text: {why}",
                    "save it as UTF-8 (e.g. iconv -f UTF-16 -t UTF-8 FILE > NEW.yaml); a config file is text",
                )
            ]
        )
    return data.decode("utf-8-sig")


def load_yaml(path: str | Path, sha256: str | None = None) -> dict[str, Any]:
    """A YAML file as a plain dict (plain data only; ``${...}`` kept as written, for the config it is
    applied to to resolve). Every problem is a listed one: a path no file system opens, a file that
    is missing, too large, not UTF-8, not YAML, not plain data, or not a mapping; with ``sha256``,
    a file whose bytes are not the ones of that digest (read once: what is checked is what loads)."""
    path = Path(path)
    text = _config_text(path, sha256)
    try:
        root = plain_yaml_root(text)
    except NotPlainYaml as exc:
        raise _cannot_load([_plain_yaml_violation(path, p) for p in exc.problems]) from None
    except yaml.YAMLError as exc:
        raise _cannot_load([_yaml_violation(path, exc)]) from None
    if root is not None and not isinstance(root, yaml.MappingNode):
        raise _cannot_load(
            [
                _file_violation(
                    path,
                    "yaml-not-mapping",
                    "the YAML file must hold a mapping of config sections",
                    "write e.g. 'model:\\n  num_layers: 4'",
                )
            ]
        )
    try:
        data = plain(OmegaConf.load(io.StringIO(text))) if root is not None else {}
    except (yaml.YAMLError, OmegaConfBaseException, OSError) as exc:
        raise _cannot_load([_yaml_violation(path, exc)]) from None
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


def config_to_yaml(cfg: ConfigContainer, path: str | Path | None = None) -> str:
    """YAML text of ``cfg`` (written to ``path`` when given); loads back equal via ``config_from_yaml``."""
    text = OmegaConf.to_yaml(OmegaConf.create(_literal_dollars(config_to_dict(cfg))))
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, text)  # a link at ``path`` is replaced, never written through
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


def container_from_dict(container_cls: type, data: Mapping[str, Any]) -> ConfigContainer:
    """Rebuild a ``container_cls`` (a ``ConfigContainer``) from :func:`config_to_dict` output.

    Typed, every error at once; the saved provenance is restored as it was written.
    """
    model_data = dict(data.get("model") or {})
    errors: list[Violation] = []
    model_cls: type = GPTModelProvider
    if TARGET_KEY in model_data:
        model_cls = class_from_target(model_data.pop(TARGET_KEY), GPTModelProvider, "model", errors) or model_cls
    if errors:
        raise OverrideError(errors, "invalid YAML config")
    base = container_cls(model=model_cls())
    saved_provenance = dict(data.get("provenance") or {})
    rest = {k: v for k, v in data.items() if k not in ("model", "provenance")}
    result = with_overrides(base, {"model": model_data, **rest}, source="yaml")
    return dataclasses.replace(result, provenance=saved_provenance)
