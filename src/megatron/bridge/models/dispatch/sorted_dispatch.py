"""The torch-native sorted dispatcher (``model.torch_native_dispatcher=sorted``, and what ``auto``
picks where it is exact and sync-free): a static-size sorted permutation whose counts stay on the
GPU (``models/torch_native/sorted_dispatcher.py``). With one EP rank nothing is exchanged; with EP > 1
the rows move over NVSHMEM where it runs (``sorted_nvshmem.py``), else over ``all_to_all_single``
with host split sizes (this path's ``collective`` transport).

Its own setting is ``model.torch_native_ep_transport``: with EP > 1, ``nvshmem`` (symmetric-memory
all-to-all, split sizes stay on the GPU), ``nccl`` (``all_to_all_single``: one device-to-host copy and
wait per exchange) or ``auto`` (``nvshmem`` where it runs, else ``nccl``). Setting it explicitly asks
for the sorted dispatcher.

This module also answers ``auto`` (:func:`choose_sorted`): with one EP rank the sorted dispatcher where
it is exact; with EP > 1 megatron's, which measured faster (see ``docs/benchmarks/ep_overlap.md``),
unless a transport is set, which asks for the sorted dispatcher over it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal, get_args

from megatron.bridge.models.dispatch import megatron_alltoall, sorted_nvshmem
from megatron.bridge.models.dispatch.dispatch_path import (
    BenchmarkArm,
    DispatchChoice,
    DispatchPath,
    DispatchRequest,
    fixed_rules,
)
from megatron.bridge.models.dispatch.sorted_common import (
    build_sorted,
    describe_sorted,
    fast_path_blockers,
    sorted_dispatch_blockers,
)
from megatron.bridge.models.torch_native import expert_rows
from megatron.bridge.utils.rule_records import Rule

TorchNativeEPTransport = Literal["auto", "nvshmem", "nccl"]
EP_TRANSPORTS: tuple[str, ...] = get_args(TorchNativeEPTransport)
AUTO_EP_REASON = (
    "measured faster than the sorted dispatcher's exchange on two H200s over NVLink; "
    "torch_native_dispatcher=sorted selects the sorted one"
)


def sorted_expert_rows(model: Any) -> float | None:
    """Expert rows a token stands for on a rank that runs the EP > 1 sorted dispatcher, which the
    config asks for by name (``torch_native_dispatcher=sorted``: it runs or the build stops): its
    static buffers hold them whatever the routing, ``torch_native_rank_capacity_factor x top-k``, or
    without a factor every source's tokens once per local expert they may reach, ``EP x min(top-k,
    local experts)`` (``expert_rows.py``; ``None``: the config does not surely run it)."""
    ep = model.expert_model_parallel_size
    if model.torch_native_dispatcher != "sorted" or ep <= 1 or not model.num_moe_experts:
        return None
    factor = model.torch_native_rank_capacity_factor
    factor = factor if expert_rows.factor_holds(factor) else None  # a bad one: its rule speaks
    return expert_rows.rows_a_token(ep, model.moe_router_topk, megatron_alltoall.local_experts(model), factor)


def _factor_set(cfg: Any, ctx: Any) -> bool:
    return cfg.model.torch_native_rank_capacity_factor is not None


def choose_sorted(request: DispatchRequest) -> DispatchChoice:
    """``sorted``: the sorted dispatcher (NVSHMEM where it runs, else ``all_to_all_single``); an
    inexact setting, or ``nvshmem`` requested where it cannot run, is an error. ``auto``: see the
    module's docstring; megatron's dispatcher, with the reason, wherever the sorted one is not picked.
    On GPUs the sorted dispatcher's index computations replay from a CUDA graph."""
    choice = _choose(request)
    if choice.path is megatron_alltoall.PATH:
        return choice
    factor = getattr(request.config, "torch_native_rank_capacity_factor", None)
    if factor is not None and request.ep_size > 1:
        choice = replace(choice, reason=f"{choice.reason}; experts hold a budget of {factor:g} x tokens x top-k rows")
    return replace(choice, index_graph=True) if request.device.type == "cuda" else choice


def _choose(request: DispatchRequest) -> DispatchChoice:
    requested, ep_size = request.requested, request.ep_size
    transport = getattr(request.config, "torch_native_ep_transport", "auto")
    blockers = fast_path_blockers(request.config, ep_size, request.tp_size)
    if blockers:
        if requested == "sorted":
            raise ValueError("torch_native_dispatcher='sorted' cannot run here: " + "; ".join(blockers))
        return megatron_alltoall.megatron_choice("; ".join(blockers))
    if ep_size == 1:
        return DispatchChoice(PATH, "none", True, "EP=1")
    if requested == "auto" and transport == "auto":
        return megatron_alltoall.megatron_choice(f"EP={ep_size}: {AUTO_EP_REASON}")
    if transport == "nccl":
        return DispatchChoice(PATH, "collective", False, f"EP={ep_size}, torch_native_ep_transport='nccl'")
    support = sorted_nvshmem.nvshmem_support(request)
    if support.ok:
        return sorted_nvshmem.nvshmem_choice(request, support)
    if transport == "nvshmem":
        raise ValueError(f"torch_native_ep_transport='nvshmem' cannot run here: {support.reason}")
    if requested == "sorted":
        return DispatchChoice(PATH, "collective", False, f"EP={ep_size}, {support.reason}")
    return megatron_alltoall.megatron_choice(f"EP={ep_size}, {support.reason}")


SORTED_RULES: tuple[Rule, ...] = (
    Rule(
        id="sorted-dispatch-must-be-exact",
        fields=(
            "model.torch_native_dispatcher",
            "model.moe_token_dispatcher_type",
            "model.expert_tensor_parallel_size",
            "model.moe_expert_capacity_factor",
            "model.pipeline_model_parallel_size",
            "model.cuda_graph_impl",
        ),
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
        holds=lambda cfg, ctx: (
            cfg.model.torch_native_dispatcher != "megatron" and cfg.model.expert_model_parallel_size > 1
        ),
        message="the EP token exchange only exists for the sorted dispatcher with EP > 1; here it would have no effect",
        fix="leave model.torch_native_ep_transport=auto, or use EP > 1 with torch_native_dispatcher auto/sorted",
    ),
    Rule(
        id="rank-capacity-factor-at-least-one",
        fields=("model.torch_native_rank_capacity_factor",),
        applies=_factor_set,
        holds=lambda cfg, ctx: expert_rows.factor_holds(cfg.model.torch_native_rank_capacity_factor),
        message="the sorted dispatcher's per-rank budget is the factor times a balanced rank's tokens x top-k; "
        "the ranks receive that many on average, so below 1.0 every micro-batch would go over it (a finite "
        "number of at least 1.0)",
        fix="set model.torch_native_rank_capacity_factor to a number >= 1.0 (e.g. 2.0), or null for the worst case",
    ),
    Rule(
        id="rank-capacity-factor-needs-sorted-ep-dispatch",
        fields=(
            "model.torch_native_rank_capacity_factor",
            "model.torch_native_dispatcher",
            "model.expert_model_parallel_size",
        ),
        applies=_factor_set,
        holds=lambda cfg, ctx: (
            cfg.model.torch_native_dispatcher == "sorted" and cfg.model.expert_model_parallel_size > 1
        ),
        message="the budget sizes the EP > 1 sorted dispatcher's expert rows and nothing else; it must be "
        "asked for by name (auto picks megatron-core's dispatcher at EP > 1), and with EP = 1 nothing is "
        "exchanged, so the experts hold exactly tokens x top-k rows already",
        fix="set model.torch_native_dispatcher=sorted with EP > 1, or model.torch_native_rank_capacity_factor=null",
    ),
)


PATH = DispatchPath(
    name="sorted",
    kind="torch_native",
    summary="the sorted dispatcher: counts stay on the GPU; with EP > 1 over all_to_all_single with host split sizes",
    token_dispatcher_type="alltoall",
    torch_native_value="sorted",
    decides_auto=True,
    fields=("model.torch_native_ep_transport", "model.torch_native_rank_capacity_factor"),
    rules=fixed_rules(SORTED_RULES),
    transports=("none", "collective"),
    choose=choose_sorted,
    describe_choice=describe_sorted,
    build=build_sorted,
    emulated=True,
    benchmark=(
        BenchmarkArm("sorted", ("model.torch_native_dispatcher=sorted", "model.torch_native_ep_transport=nccl")),
    ),
)
