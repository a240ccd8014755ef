"""A toy flex backend, as ``docs/extending.md`` ("Add a dispatch path") has one written: a name
megatron-core's flex dispatcher would run, the Blackwell GPUs it supports, a package it needs on the
GPU machines and a rule of its own.

``tests/unit_tests/test_extending_guide.py`` copies this file into ``models/dispatch/`` of a copy of the
source tree and adds its line to the registry there."""

from __future__ import annotations

from typing import Any

from megatron.bridge.models.dispatch.dispatch_path import BackendSupport, DispatchPath, PackageNeed, RunFacts
from megatron.bridge.models.dispatch.flex_common import describe_flex, flex_backend
from megatron.bridge.utils.rule_records import Rule

TOY_KERNELS = PackageNeed(
    module="toy_ep_kernels",
    rule_id="toyep-needs-toy-ep-kernels",
    message="the ToyEP backend needs the toy_ep_kernels package, which does not import here",
    fix="install toy_ep_kernels on the GPU machines",
    note_id="toyep-kernels-not-checked-on-cpu-host",
    note_message="note: toy_ep_kernels does not import on this CPU host; the GPU machines must have it",
    note_fix="make sure toy_ep_kernels is installed where the job runs",
)


def _rules(facts: RunFacts) -> tuple[Rule, ...]:
    return (
        Rule(
            id="toyep-needs-even-experts",
            group="flex-settings",
            fields=("model.moe_flex_dispatcher_backend", "model.num_moe_experts"),
            applies=lambda cfg, ctx: flex_backend(cfg) == "toyep",
            holds=lambda cfg, ctx: cfg.model.num_moe_experts % 2 == 0,
            message="ToyEP pairs experts",
            fix="use an even model.num_moe_experts",
        ),
    )


def _describe(model: Any) -> str:
    return describe_flex(model, ["toy settings"])


PATH = DispatchPath(
    name="toyep",
    kind="flex",
    summary="a toy flex backend",
    token_dispatcher_type="flex",
    packages=(TOY_KERNELS,),
    gpus=BackendSupport(
        "toyep",
        "ToyEP",
        (10,),
        nvl72=True,
        applicable="ToyEP is only applicable to Blackwell GPUs",
        supported="ToyEP is supported for Blackwell GPUs",
    ),
    rules=_rules,
    describe=_describe,
)
