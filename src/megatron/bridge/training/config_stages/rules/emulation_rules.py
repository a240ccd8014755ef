"""Rules of the emulated world (``emulation.*``), as data: what it cannot play, refused before launch.

The emulated backend plays every peer by symmetry (``megatron.bridge.emulation.backend``). That
answers collectives (and the sorted dispatcher's NVSHMEM exchange, played on the GPU by
``models/torch_native/emulated_exchange.py``); it cannot answer what a peer would send point to
point, share a flex backend's buffers with a real peer, or make one rank's shards a checkpoint
anyone could resume. Each such setting is refused
here with the reason, instead of failing or silently meaning something else inside the run.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from megatron.bridge.emulation.network import PRESETS
from megatron.bridge.models.dispatch.path_registry import configured_path
from megatron.bridge.training.config_stages.schema.rule_base import Rule, RuleContext

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer


def _emulated(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return cfg.emulation.world_size is not None


def _rule(rule_id: str, fields: tuple[str, ...], holds: Any, message: str, fix: str, **kw: Any) -> Rule:
    return Rule(
        id=rule_id,
        fields=fields,
        applies=kw.pop("applies", _emulated),
        holds=holds,
        message=message,
        fix=fix,
        group="emulation",
        **kw,
    )


def _real_world(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    return not _emulated(cfg, ctx)


def _at_defaults(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    """Every ``emulation.*`` setting but the world's size is left as it comes (nothing to apply it to)."""
    e = cfg.emulation
    return all(getattr(e, f.name) == f.default for f in dataclasses.fields(e) if f.name != "world_size")


def _dispatcher_played(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    """The emulated world can run the megatron-core dispatcher the config selects (its dispatch path
    says so, ``models/dispatch/``); a flex dispatcher without a known backend it cannot."""
    path = configured_path(cfg.model)
    return path.emulated if path is not None else cfg.model.moe_token_dispatcher_type != "flex"


def _sized_world(cfg: ConfigContainer, ctx: RuleContext) -> bool:
    e = cfg.emulation
    return _emulated(cfg, ctx) and isinstance(e.world_size, int) and isinstance(e.rank, int)


EMULATION_RULES: tuple[Rule, ...] = (
    _rule(
        "emulation-settings-need-an-emulated-world",
        (
            "emulation.world_size",
            "emulation.rank",
            "emulation.network",
            "emulation.gpus_per_node",
            "emulation.comm_sms",
            "emulation.intra_node_gbps",
            "emulation.inter_node_gbps",
            "emulation.nics_per_gpu",
            "emulation.intra_node_latency_us",
            "emulation.inter_node_latency_us",
        ),
        _at_defaults,
        "emulation.* describes an emulated world, and without emulation.world_size the run is a "
        "real one: the setting would have no effect",
        "emulate (the harness: --emulate with -ng N; in Python: "
        "cfg.emulation.world_size = N), or leave emulation.* unset",
        applies=_real_world,
    ),
    _rule(
        "emulation-network-known",
        ("emulation.network",),
        lambda cfg, ctx: cfg.emulation.network in PRESETS,
        "emulation.network names no network preset",
        f"use one of {', '.join(PRESETS)} (and override its "
        "figures with emulation.intra_node_gbps, inter_node_gbps, ...)",
    ),
    _rule(
        "emulation-rank-in-world",
        ("emulation.rank", "emulation.world_size"),
        lambda cfg, ctx: 0 <= cfg.emulation.rank < cfg.emulation.world_size,
        "the emulated rank must be one of the world's ranks",
        "give emulation.rank (--emulate_rank) in [0, world size)",
        applies=_sized_world,
    ),
    _rule(
        "emulation-no-checkpoints",
        ("checkpoint.save", "checkpoint.load"),
        lambda cfg, ctx: not cfg.checkpoint.save and not cfg.checkpoint.load,
        "an emulated rank holds one rank's shards and a symmetric stand-in for the others: a checkpoint of it "
        "could never be resumed, by a real world or an emulated one",
        "unset checkpoint.save and checkpoint.load for an emulated run",
    ),
    _rule(
        "emulation-no-pipeline-parallel",
        ("model.pipeline_model_parallel_size",),
        lambda cfg, ctx: cfg.model.pipeline_model_parallel_size == 1,
        "pipeline stages send activations point to point and do different work, which symmetry cannot "
        "play: the emulated world covers layouts without pipeline parallelism",
        "emulate with -pp 1 (or measure pipeline layouts on real GPUs)",
    ),
    _rule(
        "emulation-no-context-parallel",
        ("model.context_parallel_size",),
        lambda cfg, ctx: cfg.model.context_parallel_size == 1,
        "context parallelism exchanges key/value blocks point to point between different sequence chunks, "
        "which symmetry cannot play",
        "emulate with -cp 1",
    ),
    _rule(
        "emulation-no-flex-dispatcher",
        ("model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend"),
        _dispatcher_played,
        "the flex dispatcher's backends (DeepEP, HybridEP, NCCL EP) move tokens through buffers their kernels "
        "share with real peers: there is nothing to emulate them with",
        "emulate with --moe_flex_dispatcher_backend None (megatron's alltoall dispatcher or the torch-native "
        "sorted one)",
    ),
    _rule(
        "emulation-no-nvshmem-blocks",
        ("model.torch_native_nvshmem_blocks",),
        lambda cfg, ctx: cfg.model.torch_native_nvshmem_blocks is None,
        "the emulated NVSHMEM exchange launches no torch kernel whose thread blocks this could set: its "
        "modeled exchange holds emulation.comm_sms SMs, so the setting would have no effect",
        "leave model.torch_native_nvshmem_blocks unset and set emulation.comm_sms to the blocks to model",
    ),
    _rule(
        "emulation-no-gloo-on-gpus",
        ("dist.distributed_backend", "dist.device"),
        lambda cfg, ctx: not (cfg.dist.distributed_backend == "gloo" and cfg.dist.device == "cuda"),
        "gloo between ranks that share a GPU is a real multi-process world; the emulated world has one "
        "process, whose collectives the emulated backend answers",
        "leave dist.distributed_backend unset",
    ),
)
"""The emulated world's refusals (the backend's own refusals cover the collectives it cannot play)."""
