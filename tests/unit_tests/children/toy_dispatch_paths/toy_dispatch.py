"""A toy torch-native dispatch path, as ``docs/extending.md`` ("Add a dispatch path") has one written:
the sorted dispatcher for one EP rank under another name, with a rule of its own.

``tests/unit_tests/test_extending_guide.py`` copies this file into ``models/dispatch/`` of a copy of the
source tree and adds its line to the registry there."""

from __future__ import annotations

from typing import Any

from megatron.bridge.models.dispatch.dispatch_path import BenchmarkArm, DispatchChoice, DispatchPath, RunFacts
from megatron.bridge.utils.rule_records import Rule

TOY_RULES: tuple[Rule, ...] = (
    Rule(
        id="toy-dispatch-needs-one-ep-rank",
        fields=("model.torch_native_dispatcher", "model.expert_model_parallel_size"),
        applies=lambda cfg, ctx: cfg.model.torch_native_dispatcher == "toy",
        holds=lambda cfg, ctx: cfg.model.expert_model_parallel_size == 1,
        message="the toy dispatcher exchanges nothing: it runs with one EP rank only",
        fix="use -ep 1, or model.torch_native_dispatcher=auto",
    ),
)


def _rules(facts: RunFacts) -> tuple[Rule, ...]:
    return TOY_RULES


def _choose(request: Any) -> DispatchChoice:
    return DispatchChoice(PATH, "none", True, f"EP={request.ep_size}")


def _describe_choice(choice: DispatchChoice) -> str:
    return f"toy dispatcher ({choice.reason})"


def _build(build: Any) -> Any:
    from megatron.bridge.models.torch_native.sorted_dispatcher import SortedTokenDispatcher

    class ToyDispatcher(SortedTokenDispatcher):
        """The sorted dispatcher, by another name."""

    return ToyDispatcher(**build.layer.dispatcher_arguments())


PATH = DispatchPath(
    name="toy",
    kind="torch_native",
    summary="a toy: the sorted dispatcher for one EP rank",
    token_dispatcher_type="alltoall",
    torch_native_value="toy",
    rules=_rules,
    transports=("none",),
    choose=_choose,
    describe_choice=_describe_choice,
    build=_build,
    emulated=True,
    benchmark=(BenchmarkArm("toy", ("model.torch_native_dispatcher=toy",)),),
)
