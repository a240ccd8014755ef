"""Which token dispatcher a torch-native MoE layer runs, over which transport, and why.

Kept apart from the dispatchers themselves (no megatron MoE imports) so that validation rules and
dry runs can ask the same questions on a CPU login node. These model fields decide:

* ``torch_native_dispatcher``: ``auto`` | ``sorted`` | ``megatron`` | ``node_aware`` (see
  :func:`choose_dispatch`);
* ``torch_native_gpus_per_node``: where the node boundaries lie for ``node_aware`` (see
  :func:`node_layout_problem`);
* ``torch_native_ep_transport``: with EP > 1, how the sorted dispatcher moves rows between ranks:
  ``nvshmem`` (torch's symmetric-memory ``all_to_all_vdev``: split sizes stay on the GPU, the host
  never waits), ``nccl`` (``all_to_all_single``, which needs the split sizes on the host: one
  device-to-host copy and wait per exchange), or ``auto`` (``nvshmem`` where it runs, else ``nccl``).
  Setting it explicitly asks for the sorted dispatcher;
* ``torch_native_nvshmem_blocks``: thread blocks of each NVSHMEM all-to-all (torch's
  ``TORCH_SYMMMEM_NBLOCKS``; ``None`` keeps torch's choice, up to 64). The kernel is a cooperative
  launch: all its blocks must be resident at once, so while large GEMMs fill the GPU, fewer blocks
  start sooner and overlap better, at some cost in bandwidth.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, List, Optional, get_args

import torch

from megatron.bridge.models.gpt_provider import TORCH_NATIVE_DISPATCHERS, TorchNativeEPTransport
from megatron.bridge.models.torch_native import symmetric_exchange
from megatron.bridge.models.torch_native.symmetric_exchange import NVSHMEM_BLOCKS_ENV

if TYPE_CHECKING:
    import torch.distributed as dist

MEGATRON_TRANSPORT = "all_to_all_single with host split sizes"
AUTO_EP_REASON = (
    "measured faster than the sorted dispatcher's exchange on two H200s over NVLink; "
    "torch_native_dispatcher=sorted selects the sorted one"
)
EP_TRANSPORTS = get_args(TorchNativeEPTransport)
MAX_NVSHMEM_BLOCKS = 64
PER_LAYER_GRAPH_IMPLS = ("local", "transformer_engine")
"""CUDA graphs that capture parts of a layer around megatron's dispatcher; the whole-iteration graph
(``full_iteration``) captures the sorted dispatcher's sync-free step as it is."""


def static_blockers(config: Any, tp_size: int) -> List[str]:
    """Settings under which the sorted dispatchers would not be exact (empty list: none)."""
    checks = (
        (config.moe_token_dispatcher_type != "alltoall", "dispatcher is not alltoall"),
        (tp_size != 1, f"expert tensor parallel size {tp_size} > 1"),
        (config.moe_expert_capacity_factor is not None, "token dropping (moe_expert_capacity_factor)"),
        (bool(config.moe_pad_expert_input_to_capacity), "moe_pad_expert_input_to_capacity"),
        (bool(config.moe_router_padding_for_quantization), "moe_router_padding_for_quantization"),
        (bool(config.moe_shared_expert_overlap), "moe_shared_expert_overlap"),
        (getattr(config, "moe_latent_size", None) is not None, "moe_latent_size"),
        (config.cuda_graph_impl in PER_LAYER_GRAPH_IMPLS, "per-layer CUDA graphs"),
        (getattr(config, "transformer_impl", "") == "inference_optimized", "inference_optimized"),
    )
    return [why for blocked, why in checks if blocked]


def fast_path_blockers(config: Any, ep_size: int, tp_size: int) -> List[str]:
    """Why the sorted dispatcher cannot replace megatron's at this EP size (empty list: it can)."""
    blockers = static_blockers(config, tp_size)
    if ep_size > 1 and config.pipeline_model_parallel_size > 1:
        blockers.append("pipeline parallelism with EP > 1 (symmetric buffers are allocated by every rank at once)")
    return blockers


@dataclass(frozen=True)
class DispatchChoice:
    """Which dispatcher an MoE layer runs, with which transport, and why."""

    dispatcher: str  # "sorted", "megatron" or "node_aware"
    transport: str  # what moves tokens between EP ranks ("none" for one rank)
    sync_free: bool
    reason: str
    #: The sorted dispatcher's index computations replay from a CUDA graph (on GPUs; see
    #: ``models/torch_native/index_graph.py``), instead of launching their kernels one by one.
    index_graph: bool = False

    def describe(self) -> str:
        if self.dispatcher == "megatron":
            return f"megatron-core alltoall dispatcher ({self.reason})"
        if self.dispatcher == "node_aware":
            return f"node-aware dispatcher, host-synchronised, transport: {self.transport} ({self.reason})"
        how = "sync-free" if self.sync_free else "host-synchronised"
        indices = ", indices from a CUDA graph" if self.index_graph else ""
        return f"sorted dispatcher, {how}{indices}, transport: {self.transport} ({self.reason})"

    def to_dict(self) -> dict:
        return dict(dispatcher=self.dispatcher, transport=self.transport, sync_free=self.sync_free,
                    index_graph=self.index_graph, reason=self.reason)


NODE_AWARE_TRANSPORT = "all_to_all_single in two stages (between nodes, then inside the node)"


def node_layout_problem(ep_size: int, gpus_per_node: Any) -> Optional[str]:
    """Why the node-aware dispatcher cannot split an EP group of ``ep_size`` ranks into nodes of
    ``gpus_per_node`` (``None``: it can). EP groups are runs of consecutive ranks (expert TP 1), so
    they cover whole nodes where ``gpus_per_node`` divides the EP size, and lie inside one node
    (one stage) where the EP size divides it; otherwise some group would straddle nodes unevenly."""
    if not isinstance(gpus_per_node, int) or isinstance(gpus_per_node, bool) or gpus_per_node < 1:
        return f"torch_native_gpus_per_node={gpus_per_node!r} is not a GPU count"
    if ep_size % gpus_per_node and gpus_per_node % ep_size:
        return (f"torch_native_gpus_per_node={gpus_per_node} neither divides the EP size {ep_size} nor is "
                "a multiple of it")
    return None


def node_count(ep_size: int, gpus_per_node: int) -> int:
    """Nodes one EP group spans (1: EP inside one node, the dispatch has one stage)."""
    return max(1, ep_size // gpus_per_node)


def node_aware_blockers(config: Any, ep_size: int, tp_size: int) -> List[str]:
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


def _node_aware_choice(config: Any, ep_size: int, tp_size: int) -> DispatchChoice:
    """The node-aware dispatcher where it can run; an error naming every blocker otherwise (it is
    only ever asked for explicitly)."""
    blockers = node_aware_blockers(config, ep_size, tp_size)
    if blockers:
        raise ValueError("torch_native_dispatcher='node_aware' cannot run here: " + "; ".join(blockers))
    gpus = config.torch_native_gpus_per_node
    nodes = node_count(ep_size, gpus)
    shape = f"{nodes} nodes x {ep_size // nodes} GPUs" if nodes > 1 else "EP inside one node: one stage"
    return DispatchChoice("node_aware", NODE_AWARE_TRANSPORT, False,
                          f"EP={ep_size}, torch_native_gpus_per_node={gpus}: {shape}")


def choose_dispatch(
    config: Any, ep_size: int, tp_size: int, ep_group: Optional["dist.ProcessGroup"], device: torch.device
) -> DispatchChoice:
    """Resolve the dispatcher fields for one MoE layer on this machine (see :func:`_choose`); on GPUs
    the sorted dispatcher's index computations replay from a CUDA graph."""
    choice = _choose(config, ep_size, tp_size, ep_group, device)
    if choice.dispatcher == "sorted" and device.type == "cuda":
        return replace(choice, index_graph=True)
    return choice


def _choose(
    config: Any, ep_size: int, tp_size: int, ep_group: Optional["dist.ProcessGroup"], device: torch.device
) -> DispatchChoice:
    """Which dispatcher and transport, and why.

    ``"auto"``: with one EP rank the sorted dispatcher where it is exact; with EP > 1 megatron's,
    which measured faster (see ``docs/benchmarks/ep_overlap.md``), unless a
    ``torch_native_ep_transport`` is set, which asks for the sorted dispatcher over that transport.
    ``"sorted"``: the sorted dispatcher (NVSHMEM where it runs, else ``all_to_all_single``); an
    inexact setting, or ``nvshmem`` requested where it cannot run, is an error. ``"megatron"``:
    megatron-core's alltoall dispatcher. ``"node_aware"``: the two-stage node-aware dispatcher, or
    an error where it cannot run (``auto`` never picks it: in the emulated cluster it was not faster
    with overlap on).
    """
    requested = getattr(config, "torch_native_dispatcher", "auto")
    transport = getattr(config, "torch_native_ep_transport", "auto")
    if requested not in TORCH_NATIVE_DISPATCHERS:
        raise ValueError(f"torch_native_dispatcher={requested!r} is not one of {TORCH_NATIVE_DISPATCHERS}")
    if transport not in EP_TRANSPORTS:
        raise ValueError(f"torch_native_ep_transport={transport!r} is not one of {EP_TRANSPORTS}")
    if requested == "megatron":
        return DispatchChoice("megatron", MEGATRON_TRANSPORT, False, "torch_native_dispatcher='megatron'")
    if requested == "node_aware":
        return _node_aware_choice(config, ep_size, tp_size)
    if requested not in ("auto", "sorted"):  # a name known to the config but given no dispatcher here
        raise ValueError(f"torch_native_dispatcher={requested!r} has no dispatcher in choose_dispatch")
    blockers = fast_path_blockers(config, ep_size, tp_size)
    if blockers:
        if requested == "sorted":
            raise ValueError("torch_native_dispatcher='sorted' cannot run here: " + "; ".join(blockers))
        return DispatchChoice("megatron", MEGATRON_TRANSPORT, False, "; ".join(blockers))
    if ep_size == 1:
        return DispatchChoice("sorted", "none", True, "EP=1")
    if requested == "auto" and transport == "auto":
        return DispatchChoice("megatron", MEGATRON_TRANSPORT, False, f"EP={ep_size}: {AUTO_EP_REASON}")
    if transport == "nccl":
        return DispatchChoice("sorted", "collective", False, f"EP={ep_size}, torch_native_ep_transport='nccl'")
    support = symmetric_exchange.symmetric_memory_support(ep_group, device)
    if support.ok:
        return DispatchChoice("sorted", "nvshmem", True, f"EP={ep_size}, {support.reason}")
    if transport == "nvshmem":
        raise ValueError(f"torch_native_ep_transport='nvshmem' cannot run here: {support.reason}")
    if requested == "sorted":
        return DispatchChoice("sorted", "collective", False, f"EP={ep_size}, {support.reason}")
    return DispatchChoice("megatron", MEGATRON_TRANSPORT, False, f"EP={ep_size}, {support.reason}")


def apply_nvshmem_blocks(blocks: Optional[int]) -> None:
    """Set torch's NVSHMEM all-to-all block count before the first exchange of the process.

    torch reads the variable once; a different value already in the environment is an error
    rather than silently ignored.
    """
    if blocks is None:
        return
    current = os.environ.get(NVSHMEM_BLOCKS_ENV)
    if current is not None and current != str(blocks):
        raise ValueError(
            f"torch_native_nvshmem_blocks={blocks} but {NVSHMEM_BLOCKS_ENV}={current} is already set in the "
            "environment (torch reads it once per process); unset one of them"
        )
    os.environ[NVSHMEM_BLOCKS_ENV] = str(blocks)
