"""Process-group, model-parallel and RNG set-up for :func:`megatron.bridge.training.pretrain.pretrain`.

Every parallel size comes from one owner, ``cfg.model.*_parallel_size``: the same values are given
to ``initialize_model_parallel`` and are what the model config carries. If the two disagreed, DDP
would silently average gradients of different experts across ranks. How the default process group
is made, and which groups may be made, is asked of the world the run trains in (``world.py``).
"""

from __future__ import annotations

import datetime
import logging
import os
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from megatron.core import parallel_state

from megatron.bridge.training.devices.platform import Platform, select_platform

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer
    from megatron.bridge.training.loop.world import World

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaunchEnv:
    """Rank, world size and local rank as given by torchrun or SLURM (single process otherwise)."""

    rank: int
    world_size: int
    local_rank: int
    launcher: str


def launch_env(environ: dict | None = None) -> LaunchEnv:
    """Read the launcher's environment: torchrun (``RANK``...) first, then SLURM (``SLURM_PROCID``...)."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return LaunchEnv(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0")), "torchrun")
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return LaunchEnv(
            int(env["SLURM_PROCID"]),
            int(env["SLURM_NTASKS"]),
            int(env.get("SLURM_LOCALID", "0")),
            "slurm",
        )
    return LaunchEnv(0, 1, 0, "single")


def initialize_distributed(
    cfg: ConfigContainer, world: World, env: LaunchEnv | None = None, platform: Platform | None = None
) -> LaunchEnv:
    """Create the default process group (or join an existing one) with ``cfg.dist``'s backend/timeout,
    as ``world`` makes it.

    The platform binds the rank's device first: on GPUs ``cuda:LOCAL_RANK`` modulo the visible
    devices, so several ranks can share one GPU when the backend allows it (gloo).
    """
    env = env or launch_env()
    (platform or select_platform(cfg)).bind_device(env.local_rank)
    if torch.distributed.is_initialized():
        world.join_process_group()
        return LaunchEnv(torch.distributed.get_rank(), torch.distributed.get_world_size(), env.local_rank, "existing")
    timeout = datetime.timedelta(minutes=cfg.dist.distributed_timeout_minutes)
    return world.create_process_group(env, cfg.dist.effective_backend, timeout)


def initialize_model_parallel(cfg: ConfigContainer, world: World) -> None:
    """megatron-core's parallel groups, sized from ``cfg.model`` (the single owner)."""
    m = cfg.model
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=m.tensor_model_parallel_size,
        pipeline_model_parallel_size=m.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=m.virtual_pipeline_model_parallel_size,
        context_parallel_size=m.context_parallel_size,
        expert_model_parallel_size=m.expert_model_parallel_size,
        expert_tensor_parallel_size=m.expert_tensor_parallel_size,
        distributed_timeout_minutes=cfg.dist.distributed_timeout_minutes,
        create_gloo_process_groups=world.gloo_process_groups,
    )
    world.name_groups()
    got = parallel_state.get_expert_model_parallel_world_size()
    if got != m.expert_model_parallel_size:  # defensive: the two owners must never disagree
        raise RuntimeError(
            f"expert-parallel group has {got} ranks but model.expert_model_parallel_size={m.expert_model_parallel_size}"
        )


def set_seeds(cfg: ConfigContainer, platform: Platform | None = None) -> None:
    """Seed Python, numpy, torch and megatron's model-parallel RNG tracker.

    The pipeline rank offsets the seed (different layers per stage); data-parallel ranks share it
    unless ``rng.data_parallel_random_init``.
    """
    seed = cfg.rng.seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    if cfg.rng.data_parallel_random_init:
        seed += 10 * parallel_state.get_data_parallel_rank()
    random.seed(seed)
    np.random.seed(seed)
    (platform or select_platform(cfg)).seed_model_parallel(seed)


def teardown(world: World) -> None:
    """Destroy megatron's parallel groups and the default process group, and end ``world``."""
    parallel_state.destroy_model_parallel()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    world.stop()
