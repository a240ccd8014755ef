"""The world a run trains in is one object the loop asks: picked once from ``cfg.emulation``, and the
only place of the run that knows whether the world is emulated.

The seam test reads the run's modules with ``ast`` (nothing is imported): none of them but
``loop/world.py`` imports ``megatron.bridge.emulation`` or reads an ``emulation``/``emulated``
attribute. Before, ``pretrain.py``, ``initialize.py``, ``builders.py`` and ``cuda_graphs.py`` each
branched on the emulation and looked the world up through a process-wide global.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from megatron.bridge.emulation.training_world import EmulatedTrainingWorld
from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.loop.world import RealWorld, World, world_for
from megatron.bridge.utils.error_types import MachineError

TRAINING = Path(__file__).resolve().parents[3] / "src" / "megatron" / "bridge" / "training"
RUN_MODULES = sorted(
    [
        *(TRAINING / "loop").glob("*.py"),
        *(TRAINING / "devices").glob("*.py"),
        TRAINING / "pretrain.py",
        TRAINING / "entry.py",
    ]
)
SEAM = TRAINING / "loop" / "world.py"


def _emulated_cfg(world_size=16, rank=3):
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.emulation.world_size, cfg.emulation.rank = world_size, rank
    return cfg


def test_a_config_without_an_emulated_world_trains_in_a_real_one():
    assert isinstance(world_for(qwen3_moe_tiny_pretrain_config()), RealWorld)


def test_a_config_with_an_emulated_world_trains_in_that_world():
    world = world_for(_emulated_cfg())
    assert isinstance(world, EmulatedTrainingWorld)
    assert (world.rank, world.world_size) == (3, 16)


def test_the_network_is_built_when_the_world_starts_not_when_it_is_picked():
    """The preset is checked by validation, which runs after the world is picked: a bad name must
    reach validation's message, not fail while picking the world."""
    cfg = _emulated_cfg()
    cfg.emulation.network = "no_such_network"
    world_for(cfg)  # no error here


@pytest.mark.parametrize("launched, refused", [(1, False), (2, True), (8, True)])
def test_an_emulated_world_runs_in_one_process(launched, refused):
    world = world_for(_emulated_cfg())
    if not refused:
        world.check_launch(launched)
        return
    with pytest.raises(MachineError, match=rf"plays rank 3 of 16\), but {launched} processes were launched"):
        world.check_launch(launched)


@pytest.mark.parametrize(
    "cfg, launched, validated",
    [
        (qwen3_moe_tiny_pretrain_config, 2, 2),
        (_emulated_cfg, 1, 16),
    ],
    ids=["real", "emulated"],
)
def test_the_configuration_is_validated_for_the_world_it_trains_in(cfg, launched, validated):
    world = world_for(cfg())
    world.check_launch(launched)
    assert world.size_to_validate(launched) == validated


@pytest.mark.parametrize("rank, logs", [(0, True), (1, False), (7, False)])
def test_a_real_world_logs_on_rank_zero(rank, logs):
    assert RealWorld().is_logging_rank(rank) is logs


def test_a_real_world_adds_nothing_to_the_run():
    world: World = RealWorld()
    world.begin_steps()
    world.graph_replayed()
    world.forget_graph()
    assert (world.gloo_process_groups, world.startup_lines(), world.end_step(1), world.summary()) == (
        True,
        [],
        {},
        None,
    )


def _run_imports_and_reads(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        found += [
            f"imports {name}, line {node.lineno}"
            for name in names
            if name == "megatron.bridge.emulation" or name.startswith("megatron.bridge.emulation.")
        ]
        if isinstance(node, ast.Attribute) and node.attr in ("emulation", "emulated"):
            found.append(f"reads .{node.attr}, line {node.lineno}")
    return found


@pytest.mark.parametrize(
    "path", [p for p in RUN_MODULES if p != SEAM], ids=lambda p: p.relative_to(TRAINING).as_posix()
)
def test_the_run_asks_the_world_instead_of_the_emulation(path):
    assert _run_imports_and_reads(path) == [], f"{path.name}: ask the World (loop/world.py) instead"


def test_the_seam_check_sees_a_branch_on_the_emulation(tmp_path):
    module = tmp_path / "branch.py"
    module.write_text(
        "from megatron.bridge.emulation.backend import stop_world\n"
        "def f(cfg):\n    if cfg.emulation.enabled:\n        stop_world()\n"
    )
    assert _run_imports_and_reads(module) == [
        "imports megatron.bridge.emulation.backend, line 1",
        "reads .emulation, line 3",
    ]
