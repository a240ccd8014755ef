"""The sorted dispatcher over NVSHMEM symmetric memory: with EP > 1, rows move through torch's
``all_to_all_vdev``, whose split sizes stay on the GPU, so the host never waits and the step can be
captured whole in a CUDA graph. In an emulated world the exchange is played on the device
(``models/torch_native/emulated_exchange.py``).

Asked for with ``model.torch_native_dispatcher=sorted`` (or ``auto``) and
``model.torch_native_ep_transport=nvshmem`` (or ``auto`` where NVSHMEM runs: the sorted path's choice,
``sorted_dispatch.py``). Its own setting is ``model.torch_native_nvshmem_blocks``: the thread blocks of
each exchange (torch's ``TORCH_SYMMMEM_NBLOCKS``; ``None`` keeps torch's choice, up to 64). The kernel
is a cooperative launch: all its blocks must be resident at once, so while large GEMMs fill the GPU,
fewer blocks start sooner and overlap better, at some cost in bandwidth.
"""

from __future__ import annotations

import os
from typing import Any

from megatron.bridge.models.dispatch.dispatch_path import (
    BenchmarkArm,
    DispatchChoice,
    DispatcherBuild,
    DispatchPath,
    DispatchRequest,
    fixed_rules,
)
from megatron.bridge.models.dispatch.sorted_common import build_sorted, describe_sorted
from megatron.bridge.models.torch_native import symmetric_exchange
from megatron.bridge.models.torch_native.symmetric_exchange import (
    NVSHMEM_BLOCKS_ENV,
    SymmetricMemorySupport,
    blocks_split_rows_exactly,
)
from megatron.bridge.utils.rule_records import Rule, RuleContext

MAX_NVSHMEM_BLOCKS = 64
WHOLE_ITERATION_GRAPH = ("--cuda_graph_impl", "full_iteration", "model.cuda_graph_warmup_steps=2")
"""The whole-iteration CUDA graph, captured in step 3 (before a benchmark's steady window)."""


def nvshmem_support(request: DispatchRequest) -> SymmetricMemorySupport:
    """Whether NVSHMEM's exchange runs for this layer's EP group on its device, and why (not)."""
    return symmetric_exchange.symmetric_memory_support(request.ep_group, request.device)


def nvshmem_choice(request: DispatchRequest, support: SymmetricMemorySupport) -> DispatchChoice:
    """The sorted dispatcher over NVSHMEM, where ``support`` says it runs."""
    return DispatchChoice(PATH, "nvshmem", True, f"EP={request.ep_size}, {support.reason}")


def apply_nvshmem_blocks(blocks: int | None) -> None:
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


def _build(build: DispatcherBuild) -> Any:
    apply_nvshmem_blocks(getattr(build.config, "torch_native_nvshmem_blocks", None))
    return build_sorted(build)


def _blocks_ok(cfg: Any, ctx: RuleContext) -> bool:
    blocks, ep = cfg.model.torch_native_nvshmem_blocks, cfg.model.expert_model_parallel_size
    return (
        isinstance(blocks, int)
        and ep <= blocks <= MAX_NVSHMEM_BLOCKS
        and blocks % ep == 0
        and blocks_split_rows_exactly(blocks, ep)
    )


NVSHMEM_RULES: tuple[Rule, ...] = (
    Rule(
        id="nvshmem-blocks-in-range",
        fields=(
            "model.torch_native_nvshmem_blocks",
            "model.expert_model_parallel_size",
            "model.torch_native_ep_transport",
        ),
        applies=lambda cfg, ctx: cfg.model.torch_native_nvshmem_blocks is not None,
        holds=lambda cfg, ctx: _blocks_ok(cfg, ctx) and cfg.model.torch_native_ep_transport != "nccl",
        message=f"NVSHMEM all-to-all blocks: the EP size times a power of two, at most {MAX_NVSHMEM_BLOCKS}, and "
        "only with the NVSHMEM exchange (torch's kernel splits each peer's rows evenly over its blocks per "
        "peer and stops the job with a device-side assert where they do not divide a 64-byte row)",
        fix="e.g. model.torch_native_nvshmem_blocks=8, or leave it null (torch's choice)",
    ),
)


_SELECTED = ("model.torch_native_dispatcher=sorted", "model.torch_native_ep_transport=nvshmem")

PATH = DispatchPath(
    name="sorted_nvshmem",
    kind="torch_native",
    summary="the sorted dispatcher with EP > 1 over NVSHMEM symmetric memory: split sizes stay on the GPU",
    token_dispatcher_type="alltoall",
    torch_native_value="sorted",
    fields=("model.torch_native_nvshmem_blocks",),
    rules=fixed_rules(NVSHMEM_RULES),
    transports=("nvshmem",),
    describe_choice=describe_sorted,
    build=_build,
    emulated=True,
    benchmark=(
        BenchmarkArm("sorted_nvshmem", _SELECTED),
        BenchmarkArm("sorted_nvshmem_graph", (*_SELECTED, *WHOLE_ITERATION_GRAPH)),
        # the experts hold 1.25 x a balanced rank's rows instead of EP x min(top-k, local experts):
        # the emulated world forces balanced routing, so no step goes over it
        BenchmarkArm(
            "sorted_nvshmem_graph_budget",
            (*_SELECTED, *WHOLE_ITERATION_GRAPH, "model.torch_native_rank_capacity_factor=1.25"),
        ),
    ),
)
