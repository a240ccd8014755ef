"""Rules for the torch-native MoE token dispatch fields (``model.torch_native_*``), as data.

The dispatcher itself decides at model build what this machine can run (NVSHMEM is only known on
the GPU host); these rules refuse, before launch, the settings that can never run or would have no
effect, so no accepted value is silently ignored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from megatron.bridge.emulation.network import PRESETS
from megatron.bridge.models.gpt_provider import TORCH_NATIVE_DISPATCHERS
from megatron.bridge.models.torch_native.dispatch_policy import (
    EP_TRANSPORTS,
    MAX_NVSHMEM_BLOCKS,
    fast_path_blockers,
    node_layout_problem,
)
from megatron.bridge.models.torch_native.symmetric_exchange import blocks_split_rows_exactly
from megatron.bridge.training.config_stages.facts.overlap_facts import resolved_layer_spec
from megatron.bridge.training.config_stages.schema.rule_base import Rule, RuleContext

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer


def uses_torch_native_layers(cfg: "ConfigContainer", ctx: RuleContext) -> bool:
    """Whether the run builds the torch-native layers (``auto`` decided for the target machine)."""
    return resolved_layer_spec(cfg, ctx) == "torch_native"


def _dispatch_fields_set(cfg: "ConfigContainer", ctx: RuleContext) -> bool:
    m = cfg.model
    return (m.torch_native_dispatcher != "auto" or m.torch_native_ep_transport != "auto"
            or m.torch_native_nvshmem_blocks is not None or m.torch_native_gpus_per_node is not None)


def sorted_dispatch_blockers(cfg: "ConfigContainer") -> list[str]:
    """Why the sorted dispatcher cannot run with this config's layout (empty list: it can)."""
    m = cfg.model
    etp = m.expert_tensor_parallel_size or m.tensor_model_parallel_size
    return fast_path_blockers(m, m.expert_model_parallel_size, etp)


def _node_aware(cfg: "ConfigContainer", ctx: RuleContext) -> bool:
    return cfg.model.torch_native_dispatcher == "node_aware"


def _gpu_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _node_aware_with_gpus_per_node(cfg: "ConfigContainer", ctx: RuleContext) -> bool:
    return _node_aware(cfg, ctx) and _gpu_count(cfg.model.torch_native_gpus_per_node)


def emulated_gpus_per_node(cfg: "ConfigContainer") -> "int | None":
    """GPUs per node of the emulated network (``None``: not emulated, or an unknown preset, which
    the emulation rules report)."""
    e = cfg.emulation
    if e.world_size is None or e.network not in PRESETS:
        return None
    return e.gpus_per_node or PRESETS[e.network].gpus_per_node


def _blocks_ok(cfg: "ConfigContainer", ctx: RuleContext) -> bool:
    blocks, ep = cfg.model.torch_native_nvshmem_blocks, cfg.model.expert_model_parallel_size
    return (isinstance(blocks, int) and ep <= blocks <= MAX_NVSHMEM_BLOCKS and blocks % ep == 0
            and blocks_split_rows_exactly(blocks, ep))


NODE_AWARE_RULES: tuple[Rule, ...] = (
    Rule(
        id="node-aware-dispatch-needs-gpus-per-node",
        fields=("model.torch_native_dispatcher", "model.torch_native_gpus_per_node"),
        applies=_node_aware,
        holds=lambda cfg, ctx: _gpu_count(cfg.model.torch_native_gpus_per_node),
        message="the node-aware dispatcher sends each token once per node: it must know where the node "
        "boundaries lie (GPUs per node, a whole number >= 1)",
        fix="give the harness -gn GPUS_PER_NODE (it sets model.torch_native_gpus_per_node), or set "
        "model.torch_native_gpus_per_node yourself",
    ),
    Rule(
        id="gpus-per-node-divides-ep-size",
        fields=("model.torch_native_gpus_per_node", "model.expert_model_parallel_size"),
        applies=_node_aware_with_gpus_per_node,
        holds=lambda cfg, ctx: node_layout_problem(
            cfg.model.expert_model_parallel_size, cfg.model.torch_native_gpus_per_node) is None,
        message="the node-aware dispatcher splits each EP group into whole nodes: the GPUs per node must "
        "divide the EP size (EP over several nodes) or be a multiple of it (EP inside one node: one stage); "
        "otherwise an EP group would hold more GPUs of one node than of another",
        fix="use an EP size that is a multiple of the GPUs per node (e.g. -ep 16 with -gn 8), or one that "
        "divides it",
    ),
    Rule(
        id="node-aware-dispatch-needs-ep",
        fields=("model.torch_native_dispatcher", "model.expert_model_parallel_size"),
        applies=lambda cfg, ctx: _node_aware(cfg, ctx) and bool(cfg.model.num_moe_experts),
        holds=lambda cfg, ctx: cfg.model.expert_model_parallel_size > 1,
        message="with one EP rank no token leaves its GPU: the node-aware dispatcher would have no effect",
        fix="use EP > 1, or model.torch_native_dispatcher=auto",
    ),
    Rule(
        id="node-aware-dispatch-must-be-exact",
        fields=("model.torch_native_dispatcher", "model.moe_token_dispatcher_type",
                "model.expert_tensor_parallel_size", "model.moe_expert_capacity_factor",
                "model.pipeline_model_parallel_size", "model.cuda_graph_impl"),
        applies=lambda cfg, ctx: _node_aware(cfg, ctx) and bool(cfg.model.num_moe_experts),
        holds=lambda cfg, ctx: not sorted_dispatch_blockers(cfg),
        message="the node-aware dispatcher reproduces megatron's dropless alltoall dispatcher with expert TP 1, "
        "no shared-expert overlap, no per-layer CUDA graphs and (with EP > 1) no pipeline parallelism; it "
        "reads its split sizes on the host, so no CUDA graph captures it either",
        fix="use model.torch_native_dispatcher=auto or megatron for this layout",
    ),
    Rule(
        id="node-aware-dispatch-takes-no-sorted-transport",
        fields=("model.torch_native_dispatcher", "model.torch_native_ep_transport",
                "model.torch_native_nvshmem_blocks"),
        applies=_node_aware,
        holds=lambda cfg, ctx: (cfg.model.torch_native_ep_transport == "auto"
                                and cfg.model.torch_native_nvshmem_blocks is None),
        message="the node-aware dispatcher always exchanges with all_to_all_single; the sorted dispatcher's "
        "transport and NVSHMEM block count would have no effect",
        fix="leave model.torch_native_ep_transport=auto and model.torch_native_nvshmem_blocks=null",
    ),
    Rule(
        id="gpus-per-node-needs-node-aware-dispatch",
        fields=("model.torch_native_gpus_per_node", "model.torch_native_dispatcher"),
        applies=lambda cfg, ctx: cfg.model.torch_native_gpus_per_node is not None,
        holds=_node_aware,
        message="model.torch_native_gpus_per_node is read only by the node-aware dispatcher; with another "
        "dispatcher it would have no effect",
        fix="set model.torch_native_dispatcher=node_aware, or leave model.torch_native_gpus_per_node=null",
    ),
    Rule(
        id="node-aware-gpus-per-node-matches-emulated-network",
        fields=("model.torch_native_gpus_per_node", "emulation.gpus_per_node", "emulation.network"),
        applies=lambda cfg, ctx: (_node_aware_with_gpus_per_node(cfg, ctx)
                                  and emulated_gpus_per_node(cfg) is not None),
        holds=lambda cfg, ctx: cfg.model.torch_native_gpus_per_node == emulated_gpus_per_node(cfg),
        message="in an emulated world the network model charges by its own nodes: the node-aware dispatcher "
        "must cut the EP group at the same boundaries, or the modeled inter-node bytes mean nothing",
        fix="give -gn (it sets both), or set model.torch_native_gpus_per_node to the emulated GPUs per node",
        derived_values=(("emulated_gpus_per_node", lambda cfg, ctx: emulated_gpus_per_node(cfg)),),
    ),
)
"""The node-aware dispatcher's prerequisites (``model.torch_native_dispatcher=node_aware``)."""


TORCH_NATIVE_DISPATCH_RULES: tuple[Rule, ...] = (
    Rule(
        id="torch-native-dispatcher-known",
        fields=("model.torch_native_dispatcher",),
        holds=lambda cfg, ctx: cfg.model.torch_native_dispatcher in TORCH_NATIVE_DISPATCHERS,
        message=f"the torch-native MoE dispatcher is one of {', '.join(TORCH_NATIVE_DISPATCHERS)}",
        fix="use auto (sorted where it is exact and sync-free), sorted, megatron or node_aware",
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
                "model.torch_native_nvshmem_blocks", "model.torch_native_gpus_per_node"),
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
        holds=lambda cfg, ctx: (cfg.model.torch_native_dispatcher != "megatron"
                                and cfg.model.expert_model_parallel_size > 1),
        message="the EP token exchange only exists for the sorted dispatcher with EP > 1; here it would have no effect",
        fix="leave model.torch_native_ep_transport=auto, or use EP > 1 with torch_native_dispatcher auto/sorted",
    ),
    Rule(
        id="nvshmem-blocks-in-range",
        fields=("model.torch_native_nvshmem_blocks", "model.expert_model_parallel_size",
                "model.torch_native_ep_transport"),
        applies=lambda cfg, ctx: cfg.model.torch_native_nvshmem_blocks is not None,
        holds=lambda cfg, ctx: _blocks_ok(cfg, ctx) and cfg.model.torch_native_ep_transport != "nccl",
        message=f"NVSHMEM all-to-all blocks: the EP size times a power of two, at most {MAX_NVSHMEM_BLOCKS}, and "
        "only with the NVSHMEM exchange (torch's kernel splits each peer's rows evenly over its blocks per "
        "peer and stops the job with a device-side assert where they do not divide a 64-byte row)",
        fix="e.g. model.torch_native_nvshmem_blocks=8, or leave it null (torch's choice)",
    ),
    *NODE_AWARE_RULES,
)
