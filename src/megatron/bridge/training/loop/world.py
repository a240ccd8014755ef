"""The world a run trains in: the one object the loop asks instead of branching on emulation.

A run is real (every rank a process, started by torchrun or SLURM) or emulated (one process plays
one rank of a larger world, ``emulation/``). What differs between the two is a question of
:class:`World`: how the launch is checked and validated, how the default process group is made or
joined, whether gloo groups can be made, who logs, what a step and the summary add, and what a
replayed CUDA graph counts. :func:`world_for` picks the world from ``cfg.emulation``, once, in
``pretrain()`` (and in ``entry.py`` for a job of several configs); everything else is handed it.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import torch

from megatron.bridge.emulation.training_world import EmulatedTrainingWorld

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer
    from megatron.bridge.training.loop.initialize import LaunchEnv


class CapturedCollectives(Protocol):
    """What the whole-iteration CUDA graph tells the world (``devices/cuda_graphs.py``)."""

    def graph_replayed(self) -> None:
        """The captured graph ran once (the capturing step included)."""

    def forget_graph(self) -> None:
        """A new graph will be captured: an earlier run's graph no longer runs."""


class World(CapturedCollectives, Protocol):
    """The questions the loop asks of the world it runs in."""

    gloo_process_groups: bool
    """Whether megatron-core and its optimizer may make gloo groups (they need real peers)."""

    def check_launch(self, launched_processes: int) -> None:
        """Refuse a launch this world cannot run in (``MachineError``)."""

    def size_to_validate(self, launched_world_size: int) -> int:
        """The world size the configuration is validated for."""

    def create_process_group(self, env: LaunchEnv, backend: str, timeout: timedelta) -> LaunchEnv:
        """Make the default process group; the rank and size this process has in it."""

    def join_process_group(self) -> None:
        """Use the default process group this process holds already (several configs, one start-up)."""

    def name_groups(self) -> None:
        """After megatron-core made its groups: whatever naming the world's records need."""

    def stop(self) -> None:
        """The default process group is gone: end the world."""

    def is_logging_rank(self, rank: int) -> bool:
        """Whether the process of ``rank`` writes the start-up lines, step lines and ``summary.json``."""

    def startup_lines(self) -> list[str]:
        """Lines said before the run's own start-up lines."""

    def begin_steps(self) -> None:
        """The first step is next: what set-up did is not a step's."""

    def end_step(self, iteration: int) -> dict[str, float]:
        """A step ended: scalars it adds to the step's line."""

    def summary(self) -> dict[str, Any] | None:
        """``summary.json``'s ``emulation`` section (``None`` for a real world)."""


class RealWorld:
    """Every rank a process; the default process group over the configured backend."""

    gloo_process_groups = True

    def check_launch(self, launched_processes: int) -> None:
        return None

    def size_to_validate(self, launched_world_size: int) -> int:
        return launched_world_size

    def create_process_group(self, env: LaunchEnv, backend: str, timeout: timedelta) -> LaunchEnv:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        torch.distributed.init_process_group(backend=backend, rank=env.rank, world_size=env.world_size, timeout=timeout)
        return env

    def join_process_group(self) -> None:
        return None

    def name_groups(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def is_logging_rank(self, rank: int) -> bool:
        return rank == 0

    def startup_lines(self) -> list[str]:
        return []

    def begin_steps(self) -> None:
        return None

    def end_step(self, iteration: int) -> dict[str, float]:
        return {}

    def summary(self) -> dict[str, Any] | None:
        return None

    def graph_replayed(self) -> None:
        return None

    def forget_graph(self) -> None:
        return None


def world_for(cfg: ConfigContainer) -> World:
    """The world ``cfg`` trains in: emulated when ``emulation.world_size`` is set, else real."""
    e = cfg.emulation
    if e.world_size is None:  # emulation.enabled is False
        return RealWorld()
    return EmulatedTrainingWorld(e.rank, e.world_size, e.model)
