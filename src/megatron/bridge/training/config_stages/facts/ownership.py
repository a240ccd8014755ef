"""One owner per setting: the megatron-facing fields that are copies of another field, as data.

megatron-core reads some settings from several of its configs (``model.delay_wgrad_compute`` and
``ddp.delay_wgrad_compute``; the precision flags of model, optimizer and DDP), and Megatron-Bridge's
dataset section repeats the model's sequence length. Here each of them has one owner
(``comm_overlap.<switch>``, ``mixed_precision``, ``model.seq_length``) and the other fields are copies,
written when the config is resolved (``dataset.seq_length`` also by the recipes, as Megatron-Bridge's
recipes set it). :data:`OWNED_FIELDS` lists every copy and its owner, and the
rule is enforced where values are written:

* an override (YAML, flag, dotted CLI key, a loaded config) that writes a copy is refused when it is
  parsed unless the value is the one the owner gives it (``override-owned-field``);
* a copy changed directly in Python, away from the value the owner gives it, is refused by
  ``validate()`` (``owned-field-set-directly``) instead of being overwritten without a word;
* ``validate()`` writes the effective values into the copies of the caller's config (what a user
  reads is what the run uses), and a saved config holds the owners only.

What resolution wrote into a copy is recorded beside the config
(:mod:`~megatron.bridge.training.config_stages.schema.copy_records`), not on it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from megatron.bridge.training.config_stages.facts.mixed_precision_targets import (
    LEFT_TO_USER,
    PRECISION_TARGETS,
    precision_value,
)
from megatron.bridge.training.config_stages.facts.overlap_fields import OVERLAP_FIELDS
from megatron.bridge.training.config_stages.schema import copy_records
from megatron.bridge.training.config_stages.schema.rule_base import field_default, read_field
from megatron.bridge.training.errors import Violation

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

FREE = LEFT_TO_USER
"""The owner leaves the field to the user (``mixed_precision=null``)."""


class _DecidedAtFinalize:
    def __repr__(self) -> str:
        return "<decided at finalize>"


DECIDED_AT_FINALIZE = _DecidedAtFinalize()
"""The owner is ``null`` ("framework decides"): the copy gets the computed value at finalize."""

OWNERSHIP_RULE_IDS = ("override-owned-field", "owned-field-set-directly")
"""Ids of the violations this module reports."""


@dataclass(frozen=True)
class OwnedField:
    """A megatron-facing field that is a copy of ``owner``."""

    target: str
    owner: str
    derive: Callable[[Any], Any]
    """Owner value -> the copy's value, :data:`FREE` or :data:`DECIDED_AT_FINALIZE`."""
    advice: str
    """How to set the value instead (``{value}`` is the value the user gave the copy)."""


def _overlap_copy(owner_value: Any) -> Any:
    return DECIDED_AT_FINALIZE if owner_value is None else owner_value


def _precision_copy(target: str) -> Callable[[Any], Any]:
    return lambda name: precision_value(name, target)


def _same(owner_value: Any) -> Any:
    return owner_value


FOLLOWING_COPIES: tuple[OwnedField, ...] = (
    OwnedField(
        "dataset.seq_length",
        "model.seq_length",
        _same,
        "set model.seq_length={value} instead: dataset.seq_length follows it",
    ),
)
"""Copies that hold their owner's value as it is, written by :func:`write_following_copies`."""

OWNED_FIELDS: tuple[OwnedField, ...] = (
    tuple(
        OwnedField(target, spec.key, _overlap_copy, f"set {spec.key}={{value}} instead and leave {target} out")
        for spec in OVERLAP_FIELDS
        for target in spec.targets
    )
    + tuple(
        OwnedField(
            target,
            "mixed_precision",
            _precision_copy(target),
            "choose the precision with mixed_precision (-c bf16/fp16/fp8...), or set mixed_precision=null "
            "to set the model's, optimizer's and DDP's dtype flags yourself",
        )
        for target in PRECISION_TARGETS
    )
    + FOLLOWING_COPIES
)
"""Every copy and its owner: the overlap switches' targets, the precision recipe's flags and
:data:`FOLLOWING_COPIES`."""

OWNER_OF: dict[str, OwnedField] = {owned.target: owned for owned in OWNED_FIELDS}


def owner_value(cfg: ConfigContainer, owned: OwnedField) -> Any:
    """The owner's value (``None`` also when ``comm_overlap`` itself is ``None``)."""
    holder = owned.owner.rpartition(".")[0]
    if holder and read_field(cfg, holder) is None:
        return None
    return read_field(cfg, owned.owner)


def expected_value(cfg: ConfigContainer, owned: OwnedField) -> Any:
    """The value the owner gives the copy, :data:`FREE` or :data:`DECIDED_AT_FINALIZE`."""
    return owned.derive(owner_value(cfg, owned))


def decided_copies(cfg: ConfigContainer) -> list[OwnedField]:
    """The copies of ``cfg`` whose owner decides them (not left to the user). A copy whose section
    ``cfg`` does not have (the partial view ``CommOverlapConfig.setup()`` works on) is not among them."""
    return [
        owned
        for owned in OWNED_FIELDS
        if hasattr(cfg, owned.target.partition(".")[0]) and expected_value(cfg, owned) is not FREE
    ]


def _holder(cfg: ConfigContainer, dotted: str) -> tuple[Any, str]:
    holder_path, _, name = dotted.rpartition(".")
    return read_field(cfg, holder_path), name


def remember(cfg: ConfigContainer, values: dict[str, Any]) -> None:
    """Record ``values`` (dotted copy -> value) as what the copies received from their owners."""
    for dotted, value in values.items():
        holder, name = _holder(cfg, dotted)
        copy_records.record(holder, name, value)


def written_directly(cfg: ConfigContainer, owned: OwnedField) -> bool:
    """The copy holds a value its owner did not give it (a direct write in Python)."""
    holder, name = _holder(cfg, owned.target)
    baseline = copy_records.recorded(holder, name)
    if baseline is copy_records.NOT_RECORDED:
        baseline = field_default(cfg, owned.target)
    return getattr(holder, name) != baseline


def _as_override(value: Any) -> str:
    """A value the way a dotted override writes it (``true``, ``null``, ``bf16_mixed``)."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return str(value)


def _message(owned: OwnedField, expected: Any) -> str:
    if expected is DECIDED_AT_FINALIZE:
        return f"{owned.target} is a copy of {owned.owner}, which owns it and is null (decided at finalize)"
    return f"{owned.target} is a copy of {owned.owner}, which owns it and gives it {expected!r}"


def override_violations(cfg: ConfigContainer, written: Iterable[str]) -> list[Violation]:
    """Parse-time check: every copy in ``written`` (dotted keys of one override layer, applied to
    ``cfg``) must hold the value its owner gives it."""
    found = []
    for key in written:
        owned = OWNER_OF.get(key)
        if owned is None:
            continue
        expected, given = expected_value(cfg, owned), read_field(cfg, key)
        if expected is FREE or (expected is not DECIDED_AT_FINALIZE and given == expected):
            continue
        found.append(
            Violation(
                "override-owned-field",
                (key, owned.owner),
                (given, owner_value(cfg, owned)),
                _message(owned, expected),
                owned.advice.format(value=_as_override(given)),
                value_label="given",
            )
        )
    return found


def accepted_copies(cfg: ConfigContainer, written: Iterable[str]) -> dict[str, Any]:
    """The copies in ``written`` that an override set to their owner's value (to :func:`remember`)."""
    owned_keys = {owned.target for owned in decided_copies(cfg)}
    return {key: read_field(cfg, key) for key in written if key in owned_keys}


def directly_written(cfg: ConfigContainer) -> dict[str, Any]:
    """Copies of ``cfg`` that a user wrote in Python, with their values (owner not :data:`FREE`)."""
    return {
        owned.target: read_field(cfg, owned.target) for owned in decided_copies(cfg) if written_directly(cfg, owned)
    }


def direct_write_violations(written: dict[str, Any], resolved: ConfigContainer) -> list[Violation]:
    """A copy written in Python (``written``, from :func:`directly_written` before resolution) that
    differs from the value resolution gave it (``resolved``) would be overwritten: refused."""
    found = []
    for key, given in written.items():
        owned, effective = OWNER_OF[key], read_field(resolved, key)
        if given == effective:
            continue
        found.append(
            Violation(
                "owned-field-set-directly",
                (key, owned.owner),
                (given, read_field(resolved, owned.owner)),
                f"{key} was set directly, but it is a copy of {owned.owner}, which owns it: the run "
                f"would use {effective!r}",
                owned.advice.format(value=_as_override(given)),
            )
        )
    return found


def concerns_overlap(violation: Violation) -> bool:
    """An ownership violation about a copy of an overlap switch."""
    owned = OWNER_OF.get(violation.fields[0]) if violation.fields else None
    return violation.rule in OWNERSHIP_RULE_IDS and owned is not None and owned.owner.startswith("comm_overlap.")


def write_following_copies(cfg: ConfigContainer) -> None:
    """Give each copy of :data:`FOLLOWING_COPIES` its owner's value and record it as the owner's: a
    later change of the owner (``model.seq_length=128``) then carries over, while a value written
    into the copy directly is still told apart. Resolution calls it, and so do the recipes."""
    for owned in FOLLOWING_COPIES:
        holder, name = _holder(cfg, owned.target)
        value = expected_value(cfg, owned)
        setattr(holder, name, value)
        copy_records.record(holder, name, value)


def remember_copies(cfg: ConfigContainer) -> None:
    """Record the copies of a resolved ``cfg`` as written by their owners."""
    remember(cfg, {owned.target: read_field(cfg, owned.target) for owned in decided_copies(cfg)})


def write_copies(user_cfg: ConfigContainer, resolved: ConfigContainer) -> None:
    """Give the copies of the caller's config the effective values of ``resolved`` (owners untouched)."""
    for owned in decided_copies(user_cfg):
        holder, name = _holder(user_cfg, owned.target)
        setattr(holder, name, read_field(resolved, owned.target))
    remember_copies(user_cfg)


def copies_left_out_of_yaml(cfg: ConfigContainer) -> set[str]:
    """The copies a saved config leaves out: every copy its owner decides.

    A saved config holds the owners only; loading it derives the copies again. A copy stays in when
    its owner leaves it to the user (``mixed_precision=null``: the flags are the user's own), or
    when a user wrote it directly (loading it then reports the conflict instead of hiding it).
    """
    return {owned.target for owned in decided_copies(cfg) if not written_directly(cfg, owned)}
