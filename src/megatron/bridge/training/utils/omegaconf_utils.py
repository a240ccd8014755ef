"""Typed YAML and dotted-override handling for ``ConfigContainer``, built on omegaconf.

omegaconf parses the text (YAML files, ``a.b.c=value`` dotlists, ``${...}`` interpolation); the
dataclass field annotations decide what each value becomes. So ``model.num_layers=abc`` is an error
that names the key, the value and the expected type instead of a string that fails an hour later,
and ``=1`` on a bool field is a real ``True``. A field that is a copy of another one (e.g.
``model.overlap_moe_expert_parallel_comm``, owned by ``comm_overlap.overlap_moe_expert_parallel_comm``)
cannot be set to anything but its owner's value: the override is refused with the owner's name.

Every entry point works on a copy and returns it: on error the caller's config is unchanged, and
all problems are reported together in one :class:`OverrideError` (also importable under
Megatron-Bridge's name, ``OverridesError``). The work is done by ``typed_values`` (one value),
``overrides`` (a layer of overrides), ``yaml_io`` (files) and ``hydra_overrides`` (Megatron-Bridge's
helpers: ``create_omegaconf_dict_config``, ``parse_hydra_overrides``, Hydra's ``+``/``++``/``~``
forms, and ``apply_overrides(cfg, overrides, excluded_fields)``, which updates ``cfg`` itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Optional, Union

from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.errors import ConfigFileNotFoundError, OverrideError, OverridesError
from megatron.bridge.training.utils.hydra_overrides import (
    apply_overrides,
    create_omegaconf_dict_config,
    parse_hydra_overrides,
)
from megatron.bridge.training.utils.overrides import parse_dotlist
from megatron.bridge.training.utils.typed_values import convert_value
from megatron.bridge.training.utils.yaml_io import config_to_dict, config_to_yaml, load_yaml


def process_config_with_overrides(
    cfg: ConfigContainer,
    config_filepath: Optional[Union[str, Path]] = None,
    cli_overrides: Optional[Sequence[str]] = None,
) -> ConfigContainer:
    """Apply a YAML file first, then dotted CLI overrides; return the updated copy of ``cfg``
    (:class:`ConfigFileNotFoundError`, a ``FileNotFoundError``, when the file is missing)."""
    if config_filepath is not None:
        cfg = apply_overrides(cfg, load_yaml(config_filepath), source="yaml")
    if cli_overrides:
        cfg = apply_overrides(cfg, list(cli_overrides), source="cli")
    return cfg


def config_from_yaml(path: Union[str, Path]) -> ConfigContainer:
    """Rebuild a ``ConfigContainer`` from a YAML file written by :func:`config_to_yaml`
    (:class:`ConfigFileNotFoundError` when it is missing)."""
    return ConfigContainer.from_yaml(path)


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
]
