"""Rules for the torch-native MoE token dispatch fields (``model.torch_native_*``), as data.

The dispatcher itself decides at model build what this machine can run (NVSHMEM is only known on
the GPU host); these rules refuse, before launch, the settings that can never run or would have no
effect, so no accepted value is silently ignored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from megatron.bridge.models.gpt_provider import TORCH_NATIVE_DISPATCHERS
from megatron.bridge.models.torch_native.dispatch_policy import (
    EP_TRANSPORTS,
    MAX_NVSHMEM_BLOCKS,
    fast_path_blockers,
)
from megatron.bridge.models.torch_native.symmetric_exchange import blocks_split_rows_exactly
from megatron.bridge.training.overlap.facts import resolved_layer_spec
from megatron.bridge.training.rules.core import Rule, RuleContext

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer


def uses_torch_native_layers(cfg: "ConfigContainer", ctx: RuleContext) -> bool:
    """Whether the run builds the torch-native layers (``auto`` decided for the target machine)."""
    return resolved_layer_spec(cfg, ctx) == "torch_native"


def _dispatch_fields_set(cfg: "ConfigContainer", ctx: RuleContext) -> bool:
    m = cfg.model
    return (m.torch_native_dispatcher != "auto" or m.torch_native_ep_transport != "auto"
            or m.torch_native_nvshmem_blocks is not None)


def sorted_dispatch_blockers(cfg: "ConfigContainer") -> list[str]:
    """Why the sorted dispatcher cannot run with this config's layout (empty list: it can)."""
    m = cfg.model
    etp = m.expert_tensor_parallel_size or m.tensor_model_parallel_size
    return fast_path_blockers(m, m.expert_model_parallel_size, etp)


def _blocks_ok(cfg: "ConfigContainer", ctx: RuleContext) -> bool:
    blocks, ep = cfg.model.torch_native_nvshmem_blocks, cfg.model.expert_model_parallel_size
    return (isinstance(blocks, int) and ep <= blocks <= MAX_NVSHMEM_BLOCKS and blocks % ep == 0
            and blocks_split_rows_exactly(blocks, ep))


TORCH_NATIVE_DISPATCH_RULES: tuple[Rule, ...] = (
    Rule(
        id="torch-native-dispatcher-known",
        fields=("model.torch_native_dispatcher",),
        holds=lambda cfg, ctx: cfg.model.torch_native_dispatcher in TORCH_NATIVE_DISPATCHERS,
        message=f"the torch-native MoE dispatcher is one of {', '.join(TORCH_NATIVE_DISPATCHERS)}",
        fix="use auto (sorted where it is exact and sync-free), sorted, or megatron",
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
        fields=("model.layer_spec", "model.torch_native_dispatcher", "model.torch_native_ep_transport",
                "model.torch_native_nvshmem_blocks"),
        applies=_dispatch_fields_set,
        holds=uses_torch_native_layers,
        message="the torch_native_* dispatch settings only act on the torch-native layers; with this "
        "layer spec they would have no effect",
        fix="set model.layer_spec=torch_native, or leave the torch_native_* dispatch fields at their defaults",
    ),
    Rule(
        id="sorted-dispatch-must-be-exact",
        fields=("model.torch_native_dispatcher", "model.moe_token_dispatcher_type",
                "model.expert_tensor_parallel_size", "model.moe_expert_capacity_factor",
                "model.pipeline_model_parallel_size", "model.cuda_graph_impl"),
        applies=lambda cfg, ctx: cfg.model.torch_native_dispatcher == "sorted" and bool(cfg.model.num_moe_experts),
        holds=lambda cfg, ctx: not sorted_dispatch_blockers(cfg),
        message="the sorted dispatcher is exact only for the dropless alltoall dispatcher with expert TP 1, "
        "no shared-expert overlap or per-layer CUDA graphs, and (with EP > 1) no pipeline parallelism",
        fix="use model.torch_native_dispatcher=auto (it falls back to megatron's dispatcher and says why) or megatron",
    ),
    Rule(
        id="ep-transport-needs-sorted-ep-dispatch",
        fields=("model.torch_native_ep_transport", "model.torch_native_dispatcher", "model.expert_model_parallel_size"),
        applies=lambda cfg, ctx: cfg.model.torch_native_ep_transport != "auto",
        holds=lambda cfg, ctx: cfg.model.torch_native_dispatcher != "megatron" and cfg.model.expert_model_parallel_size > 1,
        message="the EP token exchange only exists for the sorted dispatcher with EP > 1; here it would have no effect",
        fix="leave model.torch_native_ep_transport=auto, or use EP > 1 with torch_native_dispatcher auto/sorted",
    ),
    Rule(
        id="nvshmem-blocks-in-range",
        fields=("model.torch_native_nvshmem_blocks", "model.expert_model_parallel_size", "model.torch_native_ep_transport"),
        applies=lambda cfg, ctx: cfg.model.torch_native_nvshmem_blocks is not None,
        holds=lambda cfg, ctx: _blocks_ok(cfg, ctx) and cfg.model.torch_native_ep_transport != "nccl",
        message=f"NVSHMEM all-to-all blocks: the EP size times a power of two, at most {MAX_NVSHMEM_BLOCKS}, and "
        "only with the NVSHMEM exchange (torch's kernel splits each peer's rows evenly over its blocks per "
        "peer and stops the job with a device-side assert where they do not divide a 64-byte row)",
        fix="e.g. model.torch_native_nvshmem_blocks=8, or leave it null (torch's choice)",
    ),
)
