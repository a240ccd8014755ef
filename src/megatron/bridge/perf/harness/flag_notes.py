"""A flag and a dotted override that set the same field, said in one note: both, as given, and which
value the run gets from which (dotted overrides come after flags). The flags' fields are the tables of
``harness_args``; which of them a command writes, ``config_builder`` says."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from megatron.bridge.perf.harness.argument_parser import build_parser
from megatron.bridge.perf.harness.config_builder import BuiltConfig, emulation_values, flag_values
from megatron.bridge.perf.harness.harness_args import PRECEDENCE, HarnessArgs, flag_of_field
from megatron.bridge.training.harness_surface import read_field


def flag_text(args: HarnessArgs, dest: str) -> str:
    """The flag as given, in argparse's spelling of its names: ``-ep/--expert_model_parallel_size 2``,
    ``--moe_a2a_overlap false``, ``--profile``."""
    action = next(a for a in build_parser()._actions if a.dest == dest)
    names = "/".join(action.option_strings)
    return names if action.nargs == 0 else f"{names} {shown_value(getattr(args, dest))}"  # a switch: no value


def shown_value(value: Any) -> str:
    """A value as a command line writes it (``false``, ``0,1``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def override_key(text: str) -> str:
    """The dotted key of an override in any of Hydra's forms (``key=v``, ``+key=v``, ``++key=v``, ``~key``)."""
    return text.partition("=")[0].strip().lstrip("+~")


def keys_set_by_flags(args: HarnessArgs) -> list[str]:
    """Every dotted key a flag of ``args`` writes."""
    return [*flag_values(args), *emulation_values(args, num_gpus=1)]  # the keys, whatever -ng is


def flags_setting(args: HarnessArgs, key: str) -> list[str]:
    """The given flags (as :func:`flag_text` writes them) that set ``key``."""
    if key not in keys_set_by_flags(args):
        return []
    dest = flag_of_field(key)
    return [flag_text(args, dest)] if dest else []


def flag_override_notes(
    args: HarnessArgs,
    overrides: Sequence[str],
    flag_keys: Iterable[str],
    provenance: Mapping[str, str],
    value_of: Callable[[str], Any],
) -> list[str]:
    """One note for each dotted override that sets a field a flag of ``args`` also set (``flag_keys``):
    both, and which one the run gets (``provenance`` names the layer that won, ``value_of(key)`` the
    value it gave)."""
    written, notes = set(flag_keys), []
    for text in overrides:
        key = override_key(text)
        dest = flag_of_field(key) if key in written else None
        if dest is None:
            continue
        flag = flag_text(args, dest)
        source = (
            f"the dotted override (precedence: {PRECEDENCE})"
            if provenance.get(key) == "cli"
            else f"{flag}, which is applied after the dotted overrides"
        )  # --emulate: the -ng layout
        notes.append(f"{flag} and {text} both set {key}: the run gets {shown_value(value_of(key))}, from {source}")
    return notes


def built_config_notes(args: HarnessArgs, built: BuiltConfig) -> list[str]:
    """:func:`flag_override_notes` for a built job and the dotted overrides of its command line."""
    return flag_override_notes(
        args, args.overrides, keys_set_by_flags(args), built.cfg.provenance, lambda key: read_field(built.cfg, key)
    )
