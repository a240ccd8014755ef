"""DeepEP (``moe_flex_dispatcher_backend=deepep``): megatron-core's flex dispatcher over the
high-throughput kernels of the ``deep_ep`` package, which move tokens within the TP x EP group through
buffers the GPUs share (NVLink inside a node, RDMA between nodes)."""

from __future__ import annotations

from typing import Any

from megatron.bridge.models.dispatch.dispatch_path import (
    PLAIN_ALLTOALL_TEXT,
    BackendSupport,
    DispatchPath,
    PackageNeed,
    fixed_rules,
)
from megatron.bridge.models.dispatch.flex_common import NUM_SMS_FIELDS, describe_flex, effective_num_sms, flex_backend
from megatron.bridge.utils.rule_records import Rule

DEEP_EP = PackageNeed(
    module="deep_ep",
    rule_id="flex-needs-deep-ep",
    message="the DeepEP and HybridEP backends need the deep_ep package, which does not import here",
    fix="install DeepEP on the GPU machines (see https://github.com/deepseek-ai/DeepEP, hybrid-ep "
    f"branch for hybridep), or use {PLAIN_ALLTOALL_TEXT}",
    note_id="flex-deep-ep-not-checked-on-cpu-host",
    note_message="note: deep_ep does not import on this CPU host; the GPU machines must have it",
    note_fix="make sure DeepEP is installed where the job runs",
)
"""The ``deep_ep`` package: DeepEP's and HybridEP's kernels (one need, so its rules exist once)."""


def _whole_positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


DEEPEP_RULES: tuple[Rule, ...] = (
    Rule(
        id="deepep-num-sms-even",
        group="flex-settings",
        fields=NUM_SMS_FIELDS,
        applies=lambda cfg, ctx: flex_backend(cfg) == "deepep" and _whole_positive(effective_num_sms(cfg.model)),
        holds=lambda cfg, ctx: effective_num_sms(cfg.model) % 2 == 0,
        message="DeepEP runs its high-throughput kernels on pairs of SMs: deep_ep's Buffer.set_num_sms "
        "asserts an even count, when megatron-core builds the first MoE layer",
        fix="set model.moe_flex_dispatcher_num_sms to an even number (DeepEP's default is 20), or null",
    ),
)


PATH = DispatchPath(
    name="deepep",
    kind="flex",
    summary="DeepEP's kernels (the deep_ep package) inside megatron-core's flex dispatcher",
    token_dispatcher_type="flex",
    packages=(DEEP_EP,),
    gpus=BackendSupport(
        "deepep",
        "DeepEP",
        (8, 9, 10),
        nvl72=False,
        applicable="DeepEP is only applicable to Ampere, Hopper, and Blackwell (B200/B300) GPUs",
        supported="DeepEP is supported for Ampere, Hopper, and Blackwell (B200/B300) GPUs",
        blackwell_boards=("b200", "b300"),
    ),
    rules=fixed_rules(DEEPEP_RULES),
    describe=describe_flex,
)
