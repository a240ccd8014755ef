"""``pretrain``'s arguments: Megatron-Bridge's signature is accepted, what cannot work is refused.

Every call goes through ``pretrain`` itself. An accepted call reaches the resolution of the config it
was given (stopped there by a stand-in); a refused one raises ``ArgumentError`` (a ``TypeError`` and a
``ConfigError``) naming the argument, before the config is resolved or a process group exists.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.errors import ArgumentError, ConfigError
from megatron.bridge.training.gpt_step import forward_step
from megatron.bridge.training.pretrain import pretrain


class _Resolved(Exception):
    """Raised by the stand-in resolution: the arguments were accepted."""

    def __init__(self, cfg: ConfigContainer) -> None:
        super().__init__("resolved")
        self.cfg = cfg


@pytest.fixture
def stop_at_resolution(monkeypatch) -> None:
    """``ConfigContainer.resolve`` raises :class:`_Resolved` with the container it was asked for;
    no process group may be created."""

    def resolve(self, world_size=None):
        raise _Resolved(self)

    def no_process_group(*args, **kwargs):
        raise AssertionError("a process group was created")

    monkeypatch.setattr(ConfigContainer, "resolve", resolve)
    monkeypatch.setattr(torch.distributed, "init_process_group", no_process_group)


def _state_first_step(state, data_iterator, model, return_schedule_plan=False):
    return forward_step(data_iterator, model, return_schedule_plan)


# name -> how the call is made (cfg: the container, f: a forward step)
ACCEPTED = {
    "keywords (Megatron-Bridge)": lambda cfg, f: pretrain(config=cfg, forward_step_func=f),
    "positional": lambda cfg, f: pretrain(cfg, f),
    "positional with callbacks=None": lambda cfg, f: pretrain(cfg, f, None),
    "empty callbacks list": lambda cfg, f: pretrain(config=cfg, forward_step_func=f, callbacks=[]),
    "config only (GPT forward step)": lambda cfg, f: pretrain(config=cfg),
    "older cfg= keyword": lambda cfg, f: pretrain(cfg=cfg, forward_step_func=f),
}


@pytest.mark.parametrize("call", list(ACCEPTED))
def test_accepted_call_trains_the_config_it_was_given(call, stop_at_resolution) -> None:
    cfg = qwen3_moe_tiny_pretrain_config()
    with pytest.raises(_Resolved) as reached:
        ACCEPTED[call](cfg, _state_first_step)
    assert reached.value.cfg is cfg


class _Callback:
    def on_train_start(self, context) -> None:  # Megatron-Bridge's hook name
        pass


# name -> (the call, the rule id and the argument named)
REFUSED = {
    "a callback": (
        lambda cfg: pretrain(config=cfg, forward_step_func=forward_step, callbacks=[_Callback()]),
        "pretrain-callbacks-not-supported",
        "callbacks",
    ),
    "a callback manager object": (
        lambda cfg: pretrain(cfg, forward_step, _Callback()),
        "pretrain-callbacks-not-supported",
        "callbacks",
    ),
    "no config": (lambda cfg: pretrain(forward_step_func=forward_step), "pretrain-config-is-container", "config"),
    "a dict for a config": (lambda cfg: pretrain(config={"model": None}), "pretrain-config-is-container", "config"),
    "config and cfg both": (lambda cfg: pretrain(config=cfg, cfg=cfg), "pretrain-one-config", "config"),
    "a forward step that is not callable": (
        lambda cfg: pretrain(config=cfg, forward_step_func="forward_step"),
        "pretrain-forward-step-callable",
        "forward_step_func",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_argument_is_named_before_any_work(case, stop_at_resolution) -> None:
    call, rule, argument = REFUSED[case]
    with pytest.raises(ArgumentError) as info:
        call(qwen3_moe_tiny_pretrain_config())
    err = info.value
    assert isinstance(err, TypeError) and isinstance(err, ConfigError)
    assert [v.rule for v in err.violations] == [rule]
    assert argument in err.violations[0].fields
    assert "fix:" in str(err)


def test_every_unusable_argument_is_listed_at_once(stop_at_resolution) -> None:
    with pytest.raises(ArgumentError) as info:
        pretrain(config="cfg.yaml", forward_step_func=3, callbacks=[_Callback()])
    assert {v.rule for v in info.value.violations} == {
        "pretrain-config-is-container",
        "pretrain-forward-step-callable",
        "pretrain-callbacks-not-supported",
    }


def test_signature_is_megatron_bridge_s() -> None:
    """``pretrain(config, forward_step_func, callbacks=None)``: the names and order upstream's has."""
    params = list(inspect.signature(pretrain).parameters.values())
    assert [p.name for p in params[:3]] == ["config", "forward_step_func", "callbacks"]
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params[:3])
    assert params[2].default is None
