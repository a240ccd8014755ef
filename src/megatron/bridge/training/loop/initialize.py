"""Process-group, model-parallel and RNG set-up for :func:`megatron.bridge.training.pretrain.pretrain`.

Every parallel size comes from one owner, ``cfg.model.*_parallel_size``: the same values are given
to ``initialize_model_parallel`` and are what the model config carries. If the two disagreed, DDP
would silently average gradients of different experts across ranks.
"""

from __future__ import annotations

import datetime
import logging
import os
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import numpy as np
import torch
from megatron.core import parallel_state

from megatron.bridge.emulation.backend import current_world, label_groups, start_world, stop_world
from megatron.bridge.training.devices.platform import Platform, select_platform

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaunchEnv:
    """Rank, world size and local rank as given by torchrun or SLURM (single process otherwise)."""

    rank: int
    world_size: int
    local_rank: int
    launcher: str


def launch_env(environ: Optional[dict] = None) -> LaunchEnv:
    """Read the launcher's environment: torchrun (``RANK``...) first, then SLURM (``SLURM_PROCID``...)."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return LaunchEnv(
            int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0")), "torchrun"
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return LaunchEnv(
            int(env["SLURM_PROCID"]),
            int(env["SLURM_NTASKS"]),
            int(env.get("SLURM_LOCALID", "0")),
            "slurm",
        )
    return LaunchEnv(0, 1, 0, "single")


def world_to_validate(cfg: "ConfigContainer", env: LaunchEnv) -> object:
    """The world size the run is validated for: the emulated layout's, else the launcher's."""
    return cfg.emulation.world_size if cfg.emulation.enabled else env.world_size


def initialize_distributed(
    cfg: "ConfigContainer", env: Optional[LaunchEnv] = None, platform: Optional[Platform] = None
) -> LaunchEnv:
    """Create the default process group (or reuse an existing one) with ``cfg.dist``'s backend/timeout.

    The platform binds the rank's device first: on GPUs ``cuda:LOCAL_RANK`` modulo the visible
    devices, so several ranks can share one GPU when the backend allows it (gloo).
    """
    env = env or launch_env()
    (platform or select_platform(cfg)).bind_device(env.local_rank)
    if torch.distributed.is_initialized():
        if cfg.emulation.enabled:
            join_emulated_world(cfg)
        return LaunchEnv(
            torch.distributed.get_rank(), torch.distributed.get_world_size(), env.local_rank, "existing"
        )
    timeout = datetime.timedelta(minutes=cfg.dist.distributed_timeout_minutes)
    if cfg.emulation.enabled:  # this process plays one rank; the backend plays the others
        world = start_world(cfg.emulation.rank, cfg.emulation.world_size, cfg.emulation.model(), timeout)
        return LaunchEnv(world.rank, world.world_size, env.local_rank, "emulated")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    torch.distributed.init_process_group(
        backend=cfg.dist.effective_backend, rank=env.rank, world_size=env.world_size, timeout=timeout,
    )
    return env


def join_emulated_world(cfg: "ConfigContainer") -> None:
    """A run in a process whose emulated world exists (several configs, one start-up): the same
    rank of the same world size, charged for this config's network."""
    world = current_world()
    e = cfg.emulation
    if world is None or (world.world_size, world.rank) != (e.world_size, e.rank):
        have = "a real world" if world is None else f"rank {world.rank} of an emulated {world.world_size}"
        raise RuntimeError(f"this process already holds {have}; the config asks for rank {e.rank} of an emulated "
                           f"{e.world_size}: run it in a process of its own")
    world.network = e.model()


def initialize_model_parallel(cfg: "ConfigContainer") -> None:
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
        create_gloo_process_groups=not cfg.emulation.enabled,  # gloo groups would need real peers
    )
    if cfg.emulation.enabled:
        label_groups()
    got = parallel_state.get_expert_model_parallel_world_size()
    if got != m.expert_model_parallel_size:  # defensive: the two owners must never disagree
        raise RuntimeError(
            f"expert-parallel group has {got} ranks but model.expert_model_parallel_size="
            f"{m.expert_model_parallel_size}"
        )


def set_seeds(cfg: "ConfigContainer", platform: Optional[Platform] = None) -> None:
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


def teardown() -> None:
    """Destroy megatron's parallel groups and the default process group (and an emulated world)."""
    parallel_state.destroy_model_parallel()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    stop_world()
