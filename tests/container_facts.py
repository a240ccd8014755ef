"""What a user's ``ConfigContainer`` holds: extra attributes, the copies' values, the saved YAML.

Shared by the unit tests of one storage per setting and by the CPU training driver, which asks the
same questions after ``pretrain()``.
"""

from __future__ import annotations

import dataclasses

import yaml

from megatron.bridge.training.config_stages.facts.ownership import decided_copies
from megatron.bridge.training.config_stages.schema.rule_base import read_field


def attributes_beyond_fields(obj, path: str = "cfg", seen: set | None = None) -> set[str]:
    """Every attribute of a dataclass tree that is not one of its dataclass fields."""
    seen = set() if seen is None else seen
    if id(obj) in seen or not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return set()
    seen.add(id(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    found = {f"{path}.{name}" for name in vars(obj) if name not in names}
    for name in names:
        found |= attributes_beyond_fields(getattr(obj, name), f"{path}.{name}", seen)
    return found


def container_extras(cfg) -> set[str]:
    """Attributes of the container itself beyond its sections."""
    return set(vars(cfg)) - {f.name for f in dataclasses.fields(cfg)}


def copies_unlike_their_owners(cfg, effective) -> list[str]:
    """Decided copies whose value on ``cfg`` differs from the effective configuration's."""
    return [
        owned.target
        for owned in decided_copies(cfg)
        if read_field(cfg, owned.target) != read_field(effective, owned.target)
    ]


def copies_in_saved_yaml(cfg) -> list[str]:
    """Decided copies that ``cfg.to_yaml()`` writes (a saved YAML holds owners only)."""
    data = yaml.safe_load(cfg.to_yaml())
    found = []
    for owned in decided_copies(cfg):
        section, _, name = owned.target.rpartition(".")
        if name in data.get(section, {}):
            found.append(owned.target)
    return found
