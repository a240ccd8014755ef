"""megatron-core's alltoall dispatcher: ``moe_token_dispatcher_type=alltoall`` without a flex backend.

In megatron-core's layers it is the default dispatcher; in the torch-native layers it is what
``model.torch_native_dispatcher=megatron`` keeps (and what ``auto`` falls back to where the sorted
dispatcher would not be exact or would wait for the host anyway). It reads every all-to-all's split
sizes on the host (``all_to_all_single``), so the host waits for the GPU before each exchange.

Its own setting, ``model.moe_chunk_sort``: how the dispatcher reorders the rows it received by local
expert when megatron-core sorts them unfused (``moe_permute_fusion=false``, more than one local
expert): ``megatron`` (megatron-core's split into one view per EP rank and local expert, then
concatenate) or ``gather`` (one row gather, ``models/torch_native/chunk_sort.py``: the same rows
bitwise, a few host calls instead of two per chunk). The rules refuse ``gather`` wherever megatron-core
would not sort unfused, so the value always acts; the start-up line says when the gather is in place.
"""

from __future__ import annotations

from typing import Any, Literal

from megatron.bridge.models.dispatch.dispatch_path import (
    BenchmarkArm,
    DispatchChoice,
    DispatchPath,
    DispatchRequest,
    RunFacts,
)
from megatron.bridge.utils.rule_records import Rule, RuleContext

MEGATRON_TRANSPORT = "all_to_all_single with host split sizes"
CHUNK_SORT_FIELD = "model.moe_chunk_sort"
ChunkSort = Literal["megatron", "gather"]
CHUNK_SORTS: tuple[str, ...] = ("megatron", "gather")
"""``model.moe_chunk_sort``: ``megatron``, megatron-core's own split and concatenate; ``gather``, one
row gather (``models/torch_native/chunk_sort.py``)."""
GATHER_LINE = (
    "MoE chunk sort: one row gather per reorder (model.moe_chunk_sort=gather; megatron-core's unfused "
    "sort_chunks_by_idxs makes one view per EP rank and local expert)"
)


def megatron_choice(reason: str) -> DispatchChoice:
    """The torch-native layer keeps megatron's dispatcher, for ``reason``."""
    return DispatchChoice(PATH, MEGATRON_TRANSPORT, False, reason)


def _choose(request: DispatchRequest) -> DispatchChoice:
    return megatron_choice("torch_native_dispatcher='megatron'")


def _describe_choice(choice: DispatchChoice) -> str:
    return f"megatron-core alltoall dispatcher ({choice.reason})"


def _describe(model: Any) -> str:
    return "alltoall"


def local_experts(model: Any) -> int:
    """Experts a GPU holds (0 for a dense model)."""
    return (model.num_moe_experts or 0) // max(1, model.expert_model_parallel_size)


def sorts_chunks_unfused(model: Any) -> bool:
    """megatron-core's alltoall dispatcher reorders its received chunks by ``sort_chunks_by_idxs``
    unfused: dropless (no padding to capacity), more than one local expert, no permute fusion."""
    return (
        model.moe_token_dispatcher_type == "alltoall"
        and local_experts(model) > 1
        and not model.moe_permute_fusion
        and not model.moe_pad_expert_input_to_capacity
    )


def keeps_megatron_dispatcher(model: Any) -> bool:
    """A torch-native MoE layer keeps megatron's dispatcher: asked for by name, or ``auto`` at EP > 1
    with the EP transport left to ``auto`` (``sorted_dispatch.choose_sorted``)."""
    asked = model.torch_native_dispatcher
    auto_keeps = model.expert_model_parallel_size > 1 and model.torch_native_ep_transport == "auto"
    return asked == "megatron" or (asked == "auto" and auto_keeps)


def _prepare(model: Any, runs: bool) -> str | None:
    """Put the configured chunk sort in place for the process where a layer runs this path and
    megatron-core sorts unfused, megatron-core's own elsewhere (a process that trains several configs
    switches at each build). Returns the start-up line of the gather."""
    gather = runs and sorts_chunks_unfused(model) and model.moe_chunk_sort == "gather"
    # Deferred: the chunk sort loads torch and changes megatron-core's dispatcher module.
    from megatron.bridge.models.torch_native.chunk_sort import use_gather_chunk_sort

    use_gather_chunk_sort(gather)
    return GATHER_LINE if gather else None


def _gather(cfg: Any, ctx: RuleContext) -> bool:
    return cfg.model.moe_chunk_sort == "gather"


def _rules(facts: RunFacts) -> tuple[Rule, ...]:
    no_effect = (
        "megatron-core would not sort its chunks unfused here, so model.moe_chunk_sort=gather would have no effect"
    )
    keep = "set model.moe_chunk_sort=megatron"
    return (
        Rule(
            id="moe-chunk-sort-known",
            fields=(CHUNK_SORT_FIELD,),
            holds=lambda cfg, ctx: cfg.model.moe_chunk_sort in CHUNK_SORTS,
            message=f"the MoE chunk sort is one of {', '.join(CHUNK_SORTS)}",
            fix="use megatron (megatron-core's split and concatenate) or gather (one row gather)",
        ),
        Rule(
            id="moe-chunk-sort-gather-needs-alltoall-dispatcher",
            fields=(CHUNK_SORT_FIELD, "model.moe_token_dispatcher_type"),
            applies=_gather,
            holds=lambda cfg, ctx: cfg.model.moe_token_dispatcher_type == "alltoall",
            message=f"only megatron-core's alltoall dispatcher sorts chunks: {no_effect}",
            fix=f"use model.moe_token_dispatcher_type=alltoall, or {keep}",
        ),
        Rule(
            id="moe-chunk-sort-gather-needs-unfused-permute",
            fields=(CHUNK_SORT_FIELD, "model.moe_permute_fusion"),
            applies=_gather,
            holds=lambda cfg, ctx: not cfg.model.moe_permute_fusion,
            message=f"with moe_permute_fusion=true Transformer Engine's kernel sorts the chunks: {no_effect}",
            fix=f"set model.moe_permute_fusion=false, or {keep}",
        ),
        Rule(
            id="moe-chunk-sort-gather-needs-local-experts",
            fields=(CHUNK_SORT_FIELD, "model.num_moe_experts", "model.expert_model_parallel_size"),
            applies=_gather,
            holds=lambda cfg, ctx: local_experts(cfg.model) > 1,
            message="with fewer than two experts a GPU (num_moe_experts / EP; none in a dense model) there is "
            f"nothing to reorder: {no_effect}",
            fix=f"use fewer EP ranks than experts, or {keep}",
            derived_values=(("local_experts", lambda cfg, ctx: local_experts(cfg.model)),),
        ),
        Rule(
            id="moe-chunk-sort-gather-needs-dropless",
            fields=(CHUNK_SORT_FIELD, "model.moe_pad_expert_input_to_capacity"),
            applies=_gather,
            holds=lambda cfg, ctx: not cfg.model.moe_pad_expert_input_to_capacity,
            message=f"padded to capacity, the dispatcher reorders by one transpose: {no_effect}",
            fix=f"set model.moe_pad_expert_input_to_capacity=false, or {keep}",
        ),
        Rule(
            id="moe-chunk-sort-gather-needs-megatron-dispatcher",
            fields=(
                CHUNK_SORT_FIELD,
                "model.torch_native_dispatcher",
                "model.torch_native_ep_transport",
                "model.expert_model_parallel_size",
            ),
            applies=lambda cfg, ctx: _gather(cfg, ctx) and facts.uses_torch_native_layers(cfg, ctx),
            holds=lambda cfg, ctx: keeps_megatron_dispatcher(cfg.model),
            message="the torch-native layers sort their tokens in their own dispatcher unless they keep "
            f"megatron-core's (torch_native_dispatcher=megatron, or auto at EP > 1): {no_effect}",
            fix=f"set model.torch_native_dispatcher=megatron, or {keep}",
        ),
    )


PATH = DispatchPath(
    name="alltoall",
    kind="megatron",
    summary="megatron-core's alltoall dispatcher: split sizes through the host before every all-to-all",
    token_dispatcher_type="alltoall",
    torch_native_value="megatron",
    describe=_describe,
    transports=(MEGATRON_TRANSPORT,),
    choose=_choose,
    describe_choice=_describe_choice,
    fields=(CHUNK_SORT_FIELD,),
    rules=_rules,
    prepare=_prepare,
    emulated=True,
    benchmark=(BenchmarkArm("alltoall"), BenchmarkArm("alltoall_gather", (f"{CHUNK_SORT_FIELD}=gather",))),
)
