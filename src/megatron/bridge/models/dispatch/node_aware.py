"""The torch-native node-aware dispatcher (``model.torch_native_dispatcher=node_aware``): two-stage EP
dispatch that sends each token once per destination node over the inter-node link, then to its
experts' GPUs inside the node (``models/torch_native/node_aware_dispatcher.py``).

Its own setting is ``model.torch_native_gpus_per_node``: where the node boundaries lie (ranks with the
same ``global_rank // gpus_per_node`` share a node). The harness fills it in from the launch
(:func:`launch_values`). ``auto`` never picks it: in the emulated cluster it was not faster with
overlap on.
"""

from __future__ import annotations

from typing import Any

from megatron.bridge.emulation.network import PRESETS
from megatron.bridge.models.dispatch.dispatch_path import (
    BenchmarkArm,
    DispatchChoice,
    DispatcherBuild,
    DispatchPath,
    DispatchRequest,
    LaunchFacts,
    fixed_rules,
)
from megatron.bridge.models.dispatch.sorted_common import fast_path_blockers, sorted_dispatch_blockers
from megatron.bridge.utils.rule_records import Rule, RuleContext

NODE_AWARE_TRANSPORT = "all_to_all_single in two stages (between nodes, then inside the node)"
GPUS_PER_NODE_FIELD = "model.torch_native_gpus_per_node"


def node_layout_problem(ep_size: int, gpus_per_node: Any) -> str | None:
    """Why the node-aware dispatcher cannot split an EP group of ``ep_size`` ranks into nodes of
    ``gpus_per_node`` (``None``: it can). EP groups are runs of consecutive ranks (expert TP 1), so
    they cover whole nodes where ``gpus_per_node`` divides the EP size, and lie inside one node
    (one stage) where the EP size divides it; otherwise some group would straddle nodes unevenly."""
    if not isinstance(gpus_per_node, int) or isinstance(gpus_per_node, bool) or gpus_per_node < 1:
        return f"torch_native_gpus_per_node={gpus_per_node!r} is not a GPU count"
    if ep_size % gpus_per_node and gpus_per_node % ep_size:
        return (
            f"torch_native_gpus_per_node={gpus_per_node} neither divides the EP size {ep_size} nor is a multiple of it"
        )
    return None


def node_count(ep_size: int, gpus_per_node: int) -> int:
    """Nodes one EP group spans (1: EP inside one node, the dispatch has one stage)."""
    return max(1, ep_size // gpus_per_node)


def node_aware_blockers(config: Any, ep_size: int, tp_size: int) -> list[str]:
    """Why the node-aware dispatcher cannot run for this config and EP size (empty list: it can):
    the sorted dispatcher's exactness conditions, EP > 1, a node layout that splits the EP group,
    and no sorted-dispatcher transport settings (they would have no effect)."""
    blockers = fast_path_blockers(config, ep_size, tp_size)
    if ep_size < 2:
        blockers.append("EP=1: no token leaves its rank")
    problem = node_layout_problem(ep_size, getattr(config, "torch_native_gpus_per_node", None))
    if problem:
        blockers.append(problem)
    if getattr(config, "torch_native_ep_transport", "auto") != "auto":
        blockers.append("torch_native_ep_transport is a setting of the sorted dispatcher")
    if getattr(config, "torch_native_nvshmem_blocks", None) is not None:
        blockers.append("torch_native_nvshmem_blocks is a setting of the sorted dispatcher")
    return blockers


def _choose(request: DispatchRequest) -> DispatchChoice:
    """The node-aware dispatcher where it can run; an error naming every blocker otherwise (it is
    only ever asked for explicitly)."""
    config, ep_size = request.config, request.ep_size
    blockers = node_aware_blockers(config, ep_size, request.tp_size)
    if blockers:
        raise ValueError("torch_native_dispatcher='node_aware' cannot run here: " + "; ".join(blockers))
    gpus = config.torch_native_gpus_per_node
    nodes = node_count(ep_size, gpus)
    shape = f"{nodes} nodes x {ep_size // nodes} GPUs" if nodes > 1 else "EP inside one node: one stage"
    reason = f"EP={ep_size}, torch_native_gpus_per_node={gpus}: {shape}"
    return DispatchChoice(PATH, NODE_AWARE_TRANSPORT, False, reason)


def _describe_choice(choice: DispatchChoice) -> str:
    return f"node-aware dispatcher, host-synchronised, transport: {choice.transport} ({choice.reason})"


def _build(build: DispatcherBuild) -> Any:
    # Deferred: megatron-core's MoE dispatcher code is needed only where a layer is built.
    from megatron.bridge.models.torch_native.node_aware_dispatcher import NodeAwareDispatcher

    gpus_per_node = build.config.torch_native_gpus_per_node
    return NodeAwareDispatcher(**build.layer.dispatcher_arguments(), gpus_per_node=gpus_per_node)


def emulated_gpus_per_node(cfg: Any) -> int | None:
    """GPUs per node of the emulated network (``None``: not emulated, or an unknown preset, which
    the emulation rules report)."""
    e = cfg.emulation
    if e.world_size is None or e.network not in PRESETS:
        return None
    return e.gpus_per_node or PRESETS[e.network].gpus_per_node


def launch_values(cfg: Any, launch: LaunchFacts) -> dict[str, Any]:
    """``model.torch_native_gpus_per_node`` where no layer set it: ``-gn``, else the emulated
    network's GPUs per node (``--emulate``), else the launch's (``-gn``'s default; in CPU smoke mode
    every process is on this one host, so ``-gn`` alone draws node boundaries there)."""
    if cfg.model.torch_native_gpus_per_node is not None:
        return {}
    emulated = None
    if cfg.emulation.world_size is not None:
        preset = PRESETS.get(cfg.emulation.network)
        emulated = cfg.emulation.gpus_per_node or (preset.gpus_per_node if preset else None)
    return {GPUS_PER_NODE_FIELD: launch.gpus_per_node or emulated or launch.launch_gpus_per_node}


def _node_aware(cfg: Any, ctx: RuleContext) -> bool:
    return cfg.model.torch_native_dispatcher == "node_aware"


def _gpu_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _node_aware_with_gpus_per_node(cfg: Any, ctx: RuleContext) -> bool:
    return _node_aware(cfg, ctx) and _gpu_count(cfg.model.torch_native_gpus_per_node)


NODE_AWARE_RULES: tuple[Rule, ...] = (
    Rule(
        id="node-aware-dispatch-needs-gpus-per-node",
        fields=("model.torch_native_dispatcher", GPUS_PER_NODE_FIELD),
        applies=_node_aware,
        holds=lambda cfg, ctx: _gpu_count(cfg.model.torch_native_gpus_per_node),
        message="the node-aware dispatcher sends each token once per node: it must know where the node "
        "boundaries lie (GPUs per node, a whole number >= 1)",
        fix="give the harness -gn GPUS_PER_NODE (it sets model.torch_native_gpus_per_node), or set "
        "model.torch_native_gpus_per_node yourself",
    ),
    Rule(
        id="gpus-per-node-divides-ep-size",
        fields=(GPUS_PER_NODE_FIELD, "model.expert_model_parallel_size"),
        applies=_node_aware_with_gpus_per_node,
        holds=lambda cfg, ctx: (
            node_layout_problem(cfg.model.expert_model_parallel_size, cfg.model.torch_native_gpus_per_node) is None
        ),
        message="the node-aware dispatcher splits each EP group into whole nodes: the GPUs per node must "
        "divide the EP size (EP over several nodes) or be a multiple of it (EP inside one node: one stage); "
        "otherwise an EP group would hold more GPUs of one node than of another",
        fix="use an EP size that is a multiple of the GPUs per node (e.g. -ep 16 with -gn 8), or one that divides it",
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
        fields=(
            "model.torch_native_dispatcher",
            "model.moe_token_dispatcher_type",
            "model.expert_tensor_parallel_size",
            "model.moe_expert_capacity_factor",
            "model.pipeline_model_parallel_size",
            "model.cuda_graph_impl",
        ),
        applies=lambda cfg, ctx: _node_aware(cfg, ctx) and bool(cfg.model.num_moe_experts),
        holds=lambda cfg, ctx: not sorted_dispatch_blockers(cfg),
        message="the node-aware dispatcher reproduces megatron's dropless alltoall dispatcher with expert TP 1, "
        "no shared-expert overlap, no per-layer CUDA graphs and (with EP > 1) no pipeline parallelism; it "
        "reads its split sizes on the host, so no CUDA graph captures it either",
        fix="use model.torch_native_dispatcher=auto or megatron for this layout",
    ),
    Rule(
        id="node-aware-dispatch-takes-no-sorted-transport",
        fields=(
            "model.torch_native_dispatcher",
            "model.torch_native_ep_transport",
            "model.torch_native_nvshmem_blocks",
        ),
        applies=_node_aware,
        holds=lambda cfg, ctx: (
            cfg.model.torch_native_ep_transport == "auto" and cfg.model.torch_native_nvshmem_blocks is None
        ),
        message="the node-aware dispatcher always exchanges with all_to_all_single; the sorted dispatcher's "
        "transport and NVSHMEM block count would have no effect",
        fix="leave model.torch_native_ep_transport=auto and model.torch_native_nvshmem_blocks=null",
    ),
    Rule(
        id="gpus-per-node-needs-node-aware-dispatch",
        fields=(GPUS_PER_NODE_FIELD, "model.torch_native_dispatcher"),
        applies=lambda cfg, ctx: cfg.model.torch_native_gpus_per_node is not None,
        holds=_node_aware,
        message="model.torch_native_gpus_per_node is read only by the node-aware dispatcher; with another "
        "dispatcher it would have no effect",
        fix="set model.torch_native_dispatcher=node_aware, or leave model.torch_native_gpus_per_node=null",
    ),
    Rule(
        id="node-aware-gpus-per-node-matches-emulated-network",
        fields=(GPUS_PER_NODE_FIELD, "emulation.gpus_per_node", "emulation.network"),
        applies=lambda cfg, ctx: _node_aware_with_gpus_per_node(cfg, ctx) and emulated_gpus_per_node(cfg) is not None,
        holds=lambda cfg, ctx: cfg.model.torch_native_gpus_per_node == emulated_gpus_per_node(cfg),
        message="in an emulated world the network model charges by its own nodes: the node-aware dispatcher "
        "must cut the EP group at the same boundaries, or the modeled inter-node bytes mean nothing",
        fix="give -gn (it sets both), or set model.torch_native_gpus_per_node to the emulated GPUs per node",
        derived_values=(("emulated_gpus_per_node", lambda cfg, ctx: emulated_gpus_per_node(cfg)),),
    ),
)
"""The node-aware dispatcher's prerequisites (``model.torch_native_dispatcher=node_aware``)."""


PATH = DispatchPath(
    name="node_aware",
    kind="torch_native",
    summary="the node-aware dispatcher: each token crosses the inter-node link once per destination node",
    token_dispatcher_type="alltoall",
    torch_native_value="node_aware",
    fields=(GPUS_PER_NODE_FIELD,),
    rules=fixed_rules(NODE_AWARE_RULES),
    transports=(NODE_AWARE_TRANSPORT,),
    choose=_choose,
    describe_choice=_describe_choice,
    build=_build,
    emulated=True,
    benchmark=(
        BenchmarkArm(
            "node_aware",
            ("model.torch_native_dispatcher=node_aware", "model.torch_native_gpus_per_node={gpus_per_node}"),
        ),
    ),
    launch_values=launch_values,
)
