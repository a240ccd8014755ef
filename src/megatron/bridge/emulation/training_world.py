"""The emulated world as the training loop sees it: one process that plays one rank of a larger world.

The loop asks the world it runs in (``training/loop/world.py``'s ``World``) for everything that
differs between a real and an emulated run; this is the emulated answer to each question:

* the launch is one process, validated for the emulated world's size;
* the default process group is the emulated backend's (:mod:`backend`), with no gloo groups (they
  would need real peers), and megatron-core's groups are named as megatron-core names them;
* the process logs for its rank whatever rank it plays; its start-up line says the world is
  emulated and which network model charges it;
* each step's collectives are taken from the record after the step (``summary.json``'s
  ``emulation`` section keeps them all, the step line shows the modeled time);
* a captured CUDA graph's collectives are counted at each replay (:mod:`record`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from megatron.bridge.emulation.backend import EmulatedWorld, start_world, stop_world, world_of_default_group
from megatron.bridge.emulation.describe import startup_line, summary_section
from megatron.bridge.emulation.group_names import label_groups
from megatron.bridge.emulation.network import NetworkModel
from megatron.bridge.utils.error_types import MachineError

if TYPE_CHECKING:
    from megatron.bridge.training.loop.initialize import LaunchEnv


class EmulatedTrainingWorld:
    """Rank ``rank`` of an emulated world of ``world_size`` GPUs, charged for the network ``network()``
    gives (called when the world starts, after the configuration was validated)."""

    gloo_process_groups = False
    """gloo groups would need real peers; megatron-core and its optimizer are told not to make them."""

    def __init__(self, rank: int, world_size: int, network: Callable[[], NetworkModel]) -> None:
        self.rank, self.world_size, self.network = rank, world_size, network
        self.backend: EmulatedWorld | None = None
        """The backend's world (its record, hold kernel and network), once started or joined."""
        self.steps: list[dict[str, Any]] = []
        """Every step's record, in order, for ``summary.json``."""

    # ------------------------------------------------------------------ launch and process groups
    def check_launch(self, launched_processes: int) -> None:
        if launched_processes != 1:
            raise MachineError(
                f"an emulated world runs in one process (it plays rank {self.rank} of "
                f"{self.world_size}), but {launched_processes} processes were launched: start one"
            )

    def size_to_validate(self, launched_world_size: int) -> int:
        return self.world_size

    def create_process_group(self, env: LaunchEnv, backend: str, timeout: timedelta) -> LaunchEnv:
        """This process plays one rank; the backend plays the others (``backend`` is not used)."""
        self.backend = start_world(self.rank, self.world_size, self.network(), timeout)
        return dataclasses.replace(env, rank=self.backend.rank, world_size=self.backend.world_size, launcher="emulated")

    def join_process_group(self) -> None:
        """A run in a process whose emulated world exists (several configs, one start-up): the same
        rank of the same world size, charged for this config's network."""
        world = world_of_default_group()
        if world is None or (world.world_size, world.rank) != (self.world_size, self.rank):
            have = "a real world" if world is None else f"rank {world.rank} of an emulated {world.world_size}"
            raise RuntimeError(
                f"this process already holds {have}; the config asks for rank {self.rank} of an "
                f"emulated {self.world_size}: run it in a process of its own"
            )
        world.network = self.network()
        self.backend = world

    def name_groups(self) -> None:
        label_groups()

    def stop(self) -> None:
        stop_world()

    # ------------------------------------------------------------------ what the run reports
    def is_logging_rank(self, rank: int) -> bool:
        """The one process reports for its rank, whichever rank it plays."""
        return True

    def startup_lines(self) -> list[str]:
        return [startup_line(self._started())]

    def begin_steps(self) -> None:
        """What building and loading issued is not a step's."""
        self._started().record.take()

    def end_step(self, iteration: int) -> dict[str, float]:
        """The step's record, kept; the step line's scalars: modeled time and the emulation's host cost."""
        step = self._started().record.take()
        self.steps.append(dict(iteration=iteration, **step))
        return dict(modeled_comm_s=step["modeled_s"], emulation_host_s=step["host_s"])

    def summary(self) -> dict[str, Any] | None:
        return summary_section(self._started(), self.steps)

    # ------------------------------------------------------------------ a captured CUDA graph
    def graph_replayed(self) -> None:
        """The graph ran once: the collectives it captured are this step's."""
        self._started().record.replayed()

    def forget_graph(self) -> None:
        """A new graph will be captured: the previous graph's collectives are no longer run."""
        self._started().record.forget_capture()

    def _started(self) -> EmulatedWorld:
        if self.backend is None:
            raise RuntimeError("the emulated world was asked about its run before its process group existed")
        return self.backend
