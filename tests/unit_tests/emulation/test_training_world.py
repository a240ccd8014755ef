"""The emulated world as the loop sees it: the process group it makes or joins, the groups it lets the
backend make, and what each step and the summary get from its record.

No process-wide global holds the world: the backend makes the groups of the world it was started
for, a stopped world's backend makes none, and a second run in the process finds the world through
its default process group.
"""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from megatron.bridge.emulation.backend import BACKEND, EmulationUnsupported
from megatron.bridge.emulation.describe import summary_section
from megatron.bridge.emulation.network import network_model
from megatron.bridge.emulation.training_world import EmulatedTrainingWorld
from megatron.bridge.training.loop.initialize import LaunchEnv

WORLD, ME = 8, 2
TIMEOUT = datetime.timedelta(minutes=1)
ENV = LaunchEnv(rank=0, world_size=1, local_rank=0, launcher="single")


def _net(name="h100_ib400"):
    return lambda: network_model(name, gpus_per_node=4)


@pytest.fixture
def started():
    world = EmulatedTrainingWorld(ME, WORLD, _net())
    env = world.create_process_group(ENV, "gloo", TIMEOUT)
    yield world, env
    dist.destroy_process_group()
    world.stop()


def test_the_process_plays_its_rank_of_the_emulated_world(started):
    world, env = started
    assert env == LaunchEnv(rank=ME, world_size=WORLD, local_rank=0, launcher="emulated")
    assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (ME, WORLD, BACKEND)
    assert world.gloo_process_groups is False and world.is_logging_rank(ME)


def test_a_new_group_belongs_to_the_world_that_was_started(started):
    world, _ = started
    group = dist.new_group([0, 1, ME, 3])
    assert group.world is world.backend


def test_a_stopped_world_lets_the_backend_make_no_group():
    world = EmulatedTrainingWorld(ME, WORLD, _net())
    world.create_process_group(ENV, "gloo", TIMEOUT)
    dist.destroy_process_group()
    world.stop()
    with pytest.raises(EmulationUnsupported, match="before start_world"):
        dist.init_process_group(BACKEND, rank=ME, world_size=WORLD, store=dist.HashStore(), timeout=TIMEOUT)


def test_a_second_run_joins_the_world_of_the_process_and_charges_its_own_network(started):
    first, _ = started
    second = EmulatedTrainingWorld(ME, WORLD, _net("free"))
    second.join_process_group()
    assert second.backend is first.backend and second.backend.network.name == "free"


@pytest.mark.parametrize("rank, size", [(ME, 16), (0, WORLD)])
def test_a_run_for_another_rank_or_size_is_refused_in_this_process(started, rank, size):
    with pytest.raises(
        RuntimeError,
        match=rf"already holds rank {ME} of an emulated {WORLD}; the config asks "
        rf"for rank {rank} of an emulated {size}",
    ):
        EmulatedTrainingWorld(rank, size, _net()).join_process_group()


def test_a_run_in_a_process_without_an_emulated_world_is_refused():
    with pytest.raises(RuntimeError, match="already holds a real world"):
        EmulatedTrainingWorld(ME, WORLD, _net()).join_process_group()


def test_each_step_gets_its_own_collectives_and_the_summary_keeps_them(started):
    world, _ = started
    dist.all_reduce(torch.ones(4))  # building and loading: not a step's
    world.begin_steps()
    dist.all_reduce(torch.ones(4))
    scalars = world.end_step(1)
    dist.barrier()
    world.end_step(2)
    first, second = world.steps
    assert (first["iteration"], second["iteration"]) == (1, 2)
    assert list(first["groups"]["world[8]"]) == ["all_reduce"]
    assert first["groups"]["world[8]"]["all_reduce"]["calls"] == 1
    assert list(second["groups"]["world[8]"]) == ["barrier"]
    assert scalars == dict(modeled_comm_s=first["modeled_s"], emulation_host_s=first["host_s"])
    assert world.summary() == summary_section(world.backend, world.steps)
    assert world.startup_lines()[0].startswith(f"EMULATED world: this process plays rank {ME} of {WORLD}")


def test_a_world_asked_about_its_run_before_it_started_says_so():
    with pytest.raises(RuntimeError, match="before its process group existed"):
        EmulatedTrainingWorld(ME, WORLD, _net()).summary()
