"""The arguments of ``pretrain()``, checked before anything else happens.

``pretrain`` takes Megatron-Bridge's signature, ``pretrain(config, forward_step_func, callbacks=None)``,
positionally or by keyword (``cfg=`` is this package's older keyword for ``config``). What cannot
work here is refused with an :class:`~megatron.bridge.utils.error_types.ArgumentError` (a ``TypeError``)
naming the argument and what to do instead, before any process group, CUDA call or resolution:

* ``callbacks``: Megatron-Bridge's ``Callback`` hooks are not called by this training loop, so any
  callback given would never run. ``None`` or an empty list (no callbacks) is accepted.
* a ``config`` that is not a ``ConfigContainer``, or none at all, or ``config`` and ``cfg`` both;
* a ``forward_step_func`` that is not callable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from megatron.bridge.utils.error_types import ArgumentError, Violation

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

_TITLE = "pretrain() cannot take these arguments"


def _shown(value: Any) -> str:
    """A short description of an argument's value for the message (its type, and the value when short)."""
    text = repr(value)
    return text if len(text) <= 80 else f"<{type(value).__name__}>"


def _config_problem(config: Any, cfg: Any) -> Violation | None:
    """Why the config arguments cannot be used, or ``None``."""
    from megatron.bridge.training.config import ConfigContainer

    if config is not None and cfg is not None:
        return Violation(
            "pretrain-one-config",
            ("config", "cfg"),
            (_shown(config), _shown(cfg)),
            "pretrain() was given the configuration twice (cfg is this package's older name of config)",
            "pass it once: pretrain(config=cfg, forward_step_func=...)",
        )
    given = config if config is not None else cfg
    if not isinstance(given, ConfigContainer):
        return Violation(
            "pretrain-config-is-container",
            ("config",),
            (_shown(given),),
            "pretrain() trains a ConfigContainer (from a recipe or built by hand)",
            "pass one: cfg = qwen3_moe_tiny_pretrain_config(); pretrain(config=cfg, forward_step_func=...)",
        )
    return None


def _forward_step_problem(forward_step_func: Any) -> Violation | None:
    """Why ``forward_step_func`` cannot be used, or ``None`` (``None`` means the GPT forward step)."""
    if forward_step_func is None or callable(forward_step_func):
        return None
    return Violation(
        "pretrain-forward-step-callable",
        ("forward_step_func",),
        (_shown(forward_step_func),),
        "the forward step must be a function (or an object with __call__) the schedule can call",
        "pass a function such as megatron.bridge.training.gpt_step.forward_step, or leave it out for that one",
    )


def _callbacks_problem(callbacks: Any) -> Violation | None:
    """Why ``callbacks`` cannot be used, or ``None`` for no callbacks (``None`` or an empty list)."""
    if callbacks is None or (isinstance(callbacks, (list, tuple)) and not callbacks):
        return None
    return Violation(
        "pretrain-callbacks-not-supported",
        ("callbacks",),
        (_shown(callbacks),),
        "Megatron-Bridge's training callbacks are not called by this training loop, so they would never run",
        "leave callbacks out; do per-step work in the forward step (a forward step taking state first "
        "gets state.cfg and state.train_state), and read the run's summary.json (losses, step times) "
        "after it",
    )


def checked_pretrain_arguments(
    config: Any, cfg: Any, forward_step_func: Any, callbacks: Any
) -> tuple[ConfigContainer, Callable[..., Any] | None]:
    """The configuration and forward step ``pretrain`` was given; every unusable argument is listed
    in one :class:`ArgumentError`."""
    problems = [
        p
        for p in (_config_problem(config, cfg), _forward_step_problem(forward_step_func), _callbacks_problem(callbacks))
        if p is not None
    ]
    if problems:
        raise ArgumentError(problems, _TITLE)
    return (config if config is not None else cfg), forward_step_func
