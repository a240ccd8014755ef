"""A user's forward step in either signature: ours, or Megatron-Bridge's with the training state first.

megatron-core's schedules call ``forward_step(data_iterator, model)`` (plus
``return_schedule_plan=True`` under the combined-1F1B EP-overlap schedule). Megatron-Bridge scripts
write ``forward_step(state, data_iterator, model, return_schedule_plan=False)``; such a function is
recognised by its first parameter (named ``state``, or annotated ``GlobalState``) and given a
:class:`StepState` first. What the function takes is read once, from the callable, before training.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from megatron.bridge.training.errors import ConfigError, Violation

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer
    from megatron.bridge.training.loop.checkpointing import TrainState

_STATE_PARAMETER = "state"
_STATE_ANNOTATION = "GlobalState"


@dataclass
class StepState:
    """What a state-first forward step receives: the run's resolved config and its progress."""

    cfg: ConfigContainer
    train_state: TrainState
    """``iteration`` and ``consumed_samples`` of the run, updated as it trains."""


def _parameters(func: Callable[..., Any]) -> list[inspect.Parameter]:
    return list(inspect.signature(func).parameters.values())


def takes_state(func: Callable[..., Any]) -> bool:
    """Whether ``func`` has Megatron-Bridge's signature (the training state first)."""
    params = _parameters(func)
    if not params:
        return False
    first = params[0]
    annotation = first.annotation if isinstance(first.annotation, str) else getattr(first.annotation, "__name__", "")
    return first.name == _STATE_PARAMETER or _STATE_ANNOTATION in str(annotation)


def takes_schedule_plan(func: Callable[..., Any]) -> bool:
    """Whether ``func`` accepts ``return_schedule_plan`` (the EP-overlap schedule passes it)."""
    params = _parameters(func)
    return any(p.name == "return_schedule_plan" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def check_forward_step(func: Callable[..., Any], ep_overlap: bool) -> None:
    """Refuse, before training, a forward step the chosen schedule cannot call."""
    if ep_overlap and not takes_schedule_plan(func):
        name = getattr(func, "__qualname__", repr(func))
        raise ConfigError(
            [
                Violation(
                    "forward-step-needs-schedule-plan",
                    ("forward_step_func", "comm_overlap.overlap_moe_expert_parallel_comm"),
                    (name, True),
                    "the EP-overlap schedule calls the forward step with return_schedule_plan=True "
                    "(it then returns model.build_schedule_plan(...)), which this function does not take",
                    "add a return_schedule_plan=False parameter (see megatron.bridge.training.gpt_step."
                    "forward_step), or set comm_overlap.overlap_moe_expert_parallel_comm=false",
                )
            ],
            "forward step does not fit the schedule",
        )


def bind_forward_step(func: Callable[..., Any], state: StepState) -> Callable[..., Any]:
    """The callable megatron's schedules get: ``func`` itself, or ``func`` with ``state`` bound first."""
    return partial(func, state) if takes_state(func) else func
