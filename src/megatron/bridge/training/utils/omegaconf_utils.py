"""Typed YAML and dotted-override handling for ``ConfigContainer``, built on omegaconf.

omegaconf parses the text (YAML files, ``a.b.c=value`` dotlists, ``${...}`` interpolation); the
dataclass field annotations decide what each value becomes. So ``model.num_layers=abc`` is an error
that names the key, the value and the expected type instead of a string that fails an hour later,
and ``=1`` on a bool field is a real ``True``. A field that is a copy of another one (e.g.
``model.overlap_moe_expert_parallel_comm``, owned by ``comm_overlap.overlap_moe_expert_parallel_comm``)
cannot be set to anything but its owner's value: the override is refused with the owner's name.

Every entry point works on a copy (``process_config_with_overrides`` then writes the result into the
config it was given, as Megatron-Bridge's does): on error the caller's config is unchanged, and
all problems are reported together in one :class:`OverrideError` (also importable under
Megatron-Bridge's name, ``OverridesError``). The work is done by the ``reading`` stage of
:mod:`megatron.bridge.training.config_stages`: ``override_text`` (the text of dotted overrides),
``typed_values`` (one value), ``overrides`` (a layer of overrides), ``yaml_io`` (files) and
``hydra_overrides`` (Megatron-Bridge's helpers: ``create_omegaconf_dict_config``,
``parse_hydra_overrides``, Hydra's ``+``/``++``/``~`` forms, and
``apply_overrides(cfg, overrides, excluded_fields)``, which updates ``cfg`` itself).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.config_stages.reading.hydra_overrides import (
    apply_overrides,
    create_omegaconf_dict_config,
    parse_hydra_overrides,
)
from megatron.bridge.training.config_stages.reading.override_names import write_snapshot
from megatron.bridge.training.config_stages.reading.override_text import parse_dotlist
from megatron.bridge.training.config_stages.reading.typed_values import convert_value
from megatron.bridge.training.config_stages.reading.yaml_io import config_to_dict, config_to_yaml, load_yaml
from megatron.bridge.training.errors import ConfigFileNotFoundError, OverrideError, OverridesError


def process_config_with_overrides(
    cfg: ConfigContainer,
    config_filepath: str | Path | None = None,
    cli_overrides: Sequence[str] | None = None,
) -> ConfigContainer:
    """Apply a YAML file first, then dotted CLI overrides, to ``cfg`` itself, and return ``cfg``
    (Megatron-Bridge's behaviour). All or nothing: both layers are applied to a copy first, so when
    either fails (:class:`OverrideError`; :class:`ConfigFileNotFoundError`, a ``FileNotFoundError``,
    for a missing file) ``cfg`` is unchanged. ``cfg`` may be a ``ConfigContainer`` or any config
    dataclass."""
    updated = cfg
    if config_filepath is not None:
        updated = apply_overrides(updated, load_yaml(config_filepath), source="yaml")
    if cli_overrides:
        updated = apply_overrides(updated, list(cli_overrides), source="cli")
    if updated is not cfg:
        _take_fields(cfg, updated)
    return cfg


def _take_fields(cfg: Any, updated: Any) -> None:
    """Give ``cfg`` every top-level field of ``updated`` (its updated copy) that differs."""
    for f in dataclasses.fields(cfg):
        value = getattr(updated, f.name)
        if getattr(cfg, f.name) is not value:
            setattr(cfg, f.name, value)


def config_from_yaml(path: str | Path) -> ConfigContainer:
    """Rebuild a ``ConfigContainer`` from a YAML file written by :func:`config_to_yaml`
    (:class:`ConfigFileNotFoundError` when it is missing)."""
    return ConfigContainer.from_yaml(path)


def write_field_names() -> Path:
    """Store the field names of ``ConfigContainer``'s classes, which the harness reads to refuse a
    misspelt dotted override before megatron-core is imported (``reading/override_names.py``)."""
    return write_snapshot(ConfigContainer)


__all__ = [
    "ConfigFileNotFoundError",
    "OverrideError",
    "OverridesError",
    "apply_overrides",
    "create_omegaconf_dict_config",
    "parse_hydra_overrides",
    "config_from_yaml",
    "config_to_dict",
    "config_to_yaml",
    "convert_value",
    "load_yaml",
    "parse_dotlist",
    "process_config_with_overrides",
    "write_field_names",
]


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--write-field-names"]:
        raise SystemExit("usage: python -m megatron.bridge.training.utils.omegaconf_utils --write-field-names")
    print(f"wrote {write_field_names()}")
