"""What the sorted dispatcher's two paths share (``sorted_dispatch.py``: one rank, or EP over
``all_to_all_single``; ``sorted_nvshmem.py``: EP over NVSHMEM symmetric memory): the settings under
which the sorted permutation is exact, the start-up line, and the dispatcher's construction.

The node-aware dispatcher reproduces megatron's order with the same conditions (``node_aware.py``).
"""

from __future__ import annotations

from typing import Any

from megatron.bridge.models.dispatch.dispatch_path import DispatchChoice, DispatcherBuild

PER_LAYER_GRAPH_IMPLS = ("local", "transformer_engine")
"""CUDA graphs that capture parts of a layer around megatron's dispatcher; the whole-iteration graph
(``full_iteration``) captures the sorted dispatcher's sync-free step as it is."""


def static_blockers(config: Any, tp_size: int) -> list[str]:
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


def fast_path_blockers(config: Any, ep_size: int, tp_size: int) -> list[str]:
    """Why the sorted dispatcher cannot replace megatron's at this EP size (empty list: it can)."""
    blockers = static_blockers(config, tp_size)
    if ep_size > 1 and config.pipeline_model_parallel_size > 1:
        blockers.append("pipeline parallelism with EP > 1 (symmetric buffers are allocated by every rank at once)")
    return blockers


def sorted_dispatch_blockers(cfg: Any) -> list[str]:
    """:func:`fast_path_blockers` of a whole config (``cfg.model``), at its EP and expert-TP sizes."""
    m = cfg.model
    etp = m.expert_tensor_parallel_size or m.tensor_model_parallel_size
    return fast_path_blockers(m, m.expert_model_parallel_size, etp)


def describe_sorted(choice: DispatchChoice) -> str:
    """``sorted dispatcher, sync-free, indices from a CUDA graph, transport: nvshmem (EP=8, ...)``."""
    how = "sync-free" if choice.sync_free else "host-synchronised"
    indices = ", indices from a CUDA graph" if choice.index_graph else ""
    return f"sorted dispatcher, {how}{indices}, transport: {choice.transport} ({choice.reason})"


def build_sorted(build: DispatcherBuild) -> Any:
    """The sorted dispatcher for the layer: with one EP rank the one that exchanges nothing, else the
    EP dispatcher over the choice's transport, whose padding rows the torch-native experts skip."""
    # Deferred: megatron-core's MoE dispatcher code is needed only where a layer is built.
    from megatron.bridge.models.torch_native.sorted_dispatcher import (
        ExpertParallelSortedDispatcher,
        SortedTokenDispatcher,
    )

    layer = build.layer
    arguments = layer.dispatcher_arguments()
    if layer.token_dispatcher.ep_size == 1:
        return SortedTokenDispatcher(**arguments)
    dispatcher = ExpertParallelSortedDispatcher(
        **arguments,
        transport=build.choice.transport,
        rank_capacity_factor=getattr(layer.config, "torch_native_rank_capacity_factor", None),
    )
    if hasattr(layer.experts, "padded_rows"):  # the torch-native experts skip the padding rows
        layer.experts.padded_rows = True
    return dispatcher
