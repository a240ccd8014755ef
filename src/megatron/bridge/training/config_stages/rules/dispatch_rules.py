"""Rules for the torch-native MoE token dispatch fields (``model.torch_native_*``), as data.

The dispatcher itself decides at model build what this machine can run (NVSHMEM is only known on
the GPU host); these rules refuse, before launch, the settings that can never run or would have no
effect, so no accepted value is silently ignored. The rules of each dispatch path (the sorted
dispatcher's exactness, the NVSHMEM block count, the node-aware dispatcher's node layout) are the
path's own (``models/dispatch/``, gathered by ``dispatch_path_rules.py``); here are the ones about
the fields as a whole.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from megatron.bridge.models.dispatch.path_registry import torch_native_dispatchers
from megatron.bridge.models.dispatch.sorted_common import sorted_dispatch_blockers
from megatron.bridge.models.dispatch.sorted_dispatch import EP_TRANSPORTS
from megatron.bridge.training.config_stages.facts.overlap_facts import resolved_layer_spec
from megatron.bridge.training.config_stages.rules.dispatch_path_rules import TORCH_NATIVE_PATH_RULES
from megatron.bridge.training.config_stages.schema.rule_base import Rule, RuleContext

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer


def uses_torch_native_layers(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    """Whether the run builds the torch-native layers (``auto`` decided for the target machine)."""
    return resolved_layer_spec(cfg, ctx) == "torch_native"


def _dispatch_fields_set(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    m = cfg.model
    return (
        m.torch_native_dispatcher != "auto"
        or m.torch_native_ep_transport != "auto"
        or m.torch_native_nvshmem_blocks is not None
        or m.torch_native_gpus_per_node is not None
        or m.torch_native_rank_capacity_factor is not None
    )


def _dispatchers_text() -> str:
    return ", ".join(torch_native_dispatchers())


def _dispatchers_fix() -> str:
    """``use auto (sorted where it is exact and sync-free), sorted, megatron or node_aware``."""
    auto, *named = torch_native_dispatchers()
    listed = ", ".join(named[:-1]) + f" or {named[-1]}" if len(named) > 1 else "".join(named)
    return f"use {auto} (sorted where it is exact and sync-free), {listed}"


TORCH_NATIVE_DISPATCH_RULES: tuple[Rule, ...] = (
    Rule(
        id="torch-native-dispatcher-known",
        fields=("model.torch_native_dispatcher",),
        holds=lambda cfg, ctx: cfg.model.torch_native_dispatcher in torch_native_dispatchers(),
        message=f"the torch-native MoE dispatcher is one of {_dispatchers_text()}",
        fix=_dispatchers_fix(),
    ),
    Rule(
        id="torch-native-ep-transport-known",
        fields=("model.torch_native_ep_transport",),
        holds=lambda cfg, ctx: cfg.model.torch_native_ep_transport in EP_TRANSPORTS,
        message=f"the EP token exchange is one of {', '.join(EP_TRANSPORTS)}",
        fix="use auto, nvshmem or nccl",
    ),
    Rule(
        id="torch-native-dispatch-needs-torch-native-layers",
        fields=(
            "model.layer_spec",
            "model.torch_native_dispatcher",
            "model.torch_native_ep_transport",
            "model.torch_native_nvshmem_blocks",
            "model.torch_native_gpus_per_node",
            "model.torch_native_rank_capacity_factor",
        ),
        applies=_dispatch_fields_set,
        holds=uses_torch_native_layers,
        message="the torch_native_* dispatch settings only act on the torch-native layers; with this "
        "layer spec they would have no effect",
        fix="set model.layer_spec=torch_native, or leave the torch_native_* dispatch fields at their defaults",
    ),
    *TORCH_NATIVE_PATH_RULES,
)
"""The torch-native dispatch rules: the fields as a whole, then each path's own."""

__all__ = ["TORCH_NATIVE_DISPATCH_RULES", "sorted_dispatch_blockers", "uses_torch_native_layers"]
