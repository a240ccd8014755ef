"""Megatron-Bridge's ``ValidationConfig`` and ``RerunStateMachineConfig`` sections, and the upstream
fields that are accepted only at their defaults.

A script written for Megatron-Bridge builds its ``ConfigContainer`` with these sections. Here:

* ``ValidationConfig.eval_iters`` / ``eval_interval`` are other names of ``train.eval_iters`` /
  ``train.eval_interval``: one setting, stored once, in ``train``;
* every other field of these sections (and a few upstream fields of ``dist`` and ``dataset``) has
  nothing to act on in this package. It is accepted at its default, and ``validate()`` refuses any
  other value (rule ``no-effect:<field>``) with the reason and the fix, instead of ignoring it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from megatron.bridge.training.config_stages.schema.rule_base import Rule, field_default, read_field
from megatron.bridge.training.errors import ConfigValidationError, Violation
from megatron.bridge.utils.strict_fields import StrictFields

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

_NOT_GIVEN: Any = object()

EVAL_ALIASES: tuple[str, ...] = ("eval_iters", "eval_interval")
"""``ValidationConfig`` names whose owner is the field of the same name in ``train``."""


@dataclass(kw_only=True)
class _ValidationFields(StrictFields):
    """The fields of Megatron-Bridge's ``ValidationConfig`` that have no effect here."""

    start_eval_at_iter: int | None = None
    eval_global_batch_size: int | None = None
    eval_micro_batch_size: int | None = None
    skip_train: bool = False
    test_mode: bool = False
    full_validation: bool = False
    multiple_validation_sets: bool = False
    validation_set_names: list[str] | None = None


class ValidationConfig(_ValidationFields):
    """Evaluation settings under Megatron-Bridge's section name.

    ``eval_iters`` and ``eval_interval`` are aliases: in a container they read and write
    ``train.eval_iters`` / ``train.eval_interval``. Given to a section not yet in a container they
    are written into the container's ``train`` when it receives the section (``None`` until then
    means "not set"). The other fields are accepted only at their defaults (see the module).
    """

    _given: dict[str, Any]
    """The aliases given to this section before it had a container (written into it on receipt)."""
    _owner: ConfigContainer | None
    """The container whose ``train`` the aliases read and write (``None``: not in one yet)."""

    def __init__(self, *, eval_iters: Any = _NOT_GIVEN, eval_interval: Any = _NOT_GIVEN, **fields: Any) -> None:
        given = {"eval_iters": eval_iters, "eval_interval": eval_interval}
        object.__setattr__(self, "_given", {k: v for k, v in given.items() if v is not _NOT_GIVEN})
        object.__setattr__(self, "_owner", None)
        super().__init__(**fields)

    @property
    def eval_iters(self) -> int | None:
        """Alias of ``train.eval_iters``."""
        return self._read("eval_iters")

    @eval_iters.setter
    def eval_iters(self, value: int | None) -> None:
        self._write("eval_iters", value)

    @property
    def eval_interval(self) -> int | None:
        """Alias of ``train.eval_interval``."""
        return self._read("eval_interval")

    @eval_interval.setter
    def eval_interval(self, value: int | None) -> None:
        self._write("eval_interval", value)

    def _read(self, name: str) -> Any:
        if self._owner is not None:
            return getattr(self._owner.train, name)
        return self._given.get(name)

    def _write(self, name: str, value: Any) -> None:
        if self._owner is not None:
            setattr(self._owner.train, name, value)
        else:
            self._given[name] = value

    def attached_to(self, owner: ConfigContainer) -> ValidationConfig:
        """This section as ``owner`` holds it: the given eval settings written into ``owner.train``.

        A section already held by another container is copied, so that each container's aliases
        read its own ``train``. Raises ``ConfigValidationError`` when ``train`` already holds
        another explicit value for the same setting (one of the two would be dropped).
        """
        section = self if self._owner is None or self._owner is owner else copy.copy(self)
        conflicts = [c for name, value in self._given.items() if (c := _conflict(owner, name, value)) is not None]
        if conflicts:
            raise ConfigValidationError(conflicts, "conflicting evaluation settings")
        for name, value in self._given.items():
            setattr(owner.train, name, value)
        object.__setattr__(section, "_given", {})
        object.__setattr__(section, "_owner", owner)
        return section


def _conflict(owner: ConfigContainer, name: str, value: Any) -> Violation | None:
    """The violation when ``train.<name>`` holds a value other than its default and ``value``."""
    current = getattr(owner.train, name)
    if current == value or current == field_default(owner, f"train.{name}"):
        return None
    return Violation(
        "validation-alias-conflict",
        (f"validation.{name}", f"train.{name}"),
        (value, current),
        f"validation.{name} is another name of train.{name}, and the two were given different values",
        f"give the value once: set train.{name} (or validation.{name}) and leave the other out",
    )


@dataclass(kw_only=True)
class RerunStateMachineConfig(StrictFields):
    """Megatron-Bridge's rerun-state-machine section (result validation and fault injection).

    This package's loop runs megatron-core's rerun state machine disabled and does not check the
    loss itself: a NaN stops the run through ``ddp.check_for_nan_in_grad``. Every field is
    therefore accepted only at its default; ``check_for_nan_in_loss`` defaults to ``False`` here
    because the loss is not checked.
    """

    rerun_mode: Literal["disabled", "validate_results", "report_determinism_stats"] = "disabled"
    check_for_nan_in_loss: bool = False
    check_for_spiky_loss: bool = False
    spiky_loss_factor: float = 10.0
    error_injection_rate: int = 0
    error_injection_type: Literal["correct_result", "transient_error", "persistent_error"] = "transient_error"


@dataclass(frozen=True)
class NoEffectField:
    """An upstream field with nothing to act on here: ``field`` (dotted), why, and what to do."""

    field: str
    why: str
    fix: str

    @property
    def rule_id(self) -> str:
        return f"no-effect:{self.field}"

    def rule(self) -> Rule:
        """Holds while the field has its dataclass default (or its section is absent)."""
        section = self.field.rpartition(".")[0]
        return Rule(
            id=self.rule_id,
            fields=(self.field,),
            applies=lambda cfg, ctx: read_field(cfg, section) is not None,
            holds=lambda cfg, ctx: read_field(cfg, self.field) == field_default(cfg, self.field),
            message=f"{self.field} has no effect in this package: {self.why}",
            fix=f"{self.fix}, or leave {self.field} at its default",
            group="upstream",
        )


_EVAL = "this package's loop has no separate evaluation schedule or batch shape"
_RERUN = "the loop runs megatron-core's rerun state machine disabled (no re-run, no fault injection)"

NO_EFFECT_FIELDS: tuple[NoEffectField, ...] = (
    NoEffectField("validation.start_eval_at_iter", _EVAL, "use train.eval_interval"),
    NoEffectField("validation.eval_global_batch_size", _EVAL, "evaluation uses train.global_batch_size"),
    NoEffectField("validation.eval_micro_batch_size", _EVAL, "evaluation uses train.micro_batch_size"),
    NoEffectField("validation.skip_train", "a run always trains", "set train.train_iters to the steps to train"),
    NoEffectField("validation.test_mode", "there are no real-time tests to run alongside", "remove it"),
    NoEffectField("validation.full_validation", _EVAL, "use train.eval_iters"),
    NoEffectField(
        "validation.multiple_validation_sets",
        "one validation split is built from dataset.split",
        "give one blend in dataset.data_paths",
    ),
    NoEffectField("validation.validation_set_names", "one validation split is built from dataset.split", "remove it"),
    NoEffectField("rerun_state_machine.rerun_mode", _RERUN, "use rerun_mode='disabled'"),
    NoEffectField(
        "rerun_state_machine.check_for_nan_in_loss",
        "the loss is not checked for NaN here",
        "use ddp.check_for_nan_in_grad=true, which stops the run at the first NaN or Inf gradient",
    ),
    NoEffectField("rerun_state_machine.check_for_spiky_loss", _RERUN, "remove it"),
    NoEffectField("rerun_state_machine.spiky_loss_factor", _RERUN, "remove it"),
    NoEffectField("rerun_state_machine.error_injection_rate", _RERUN, "remove it"),
    NoEffectField("rerun_state_machine.error_injection_type", _RERUN, "remove it"),
    NoEffectField(
        "dist.use_gloo_process_groups",
        "megatron-core's gloo groups are always created here (the parallel state and the optimizer use them)",
        "remove it",
    ),
    NoEffectField(
        "dist.lazy_mpu_init", "the parallel groups are always initialised before the model is built", "remove it"
    ),
    NoEffectField(
        "dataset.dataloader_type",
        "batches are always consecutive slices from train.consumed_samples (megatron's 'single' sampler)",
        "use dataloader_type='single'",
    ),
    NoEffectField("dataset.num_dataset_builder_threads", "the dataset indices are built on one thread", "remove it"),
)
"""Every upstream field accepted only at its default, in the order they are reported."""

UPSTREAM_SECTION_RULES: tuple[Rule, ...] = tuple(f.rule() for f in NO_EFFECT_FIELDS)


__all__ = [
    "EVAL_ALIASES",
    "NO_EFFECT_FIELDS",
    "UPSTREAM_SECTION_RULES",
    "NoEffectField",
    "RerunStateMachineConfig",
    "ValidationConfig",
]
