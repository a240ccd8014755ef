"""The per-rank RNG state a checkpoint keeps: restored exactly, read without running any code."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from megatron.bridge.training.loop import checkpointing


class RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_saved_rng_states_restore_every_generator(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    path = tmp_path / "rank_00000.pt"
    torch.save(checkpointing._rng_state(), path)
    want = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    checkpointing._set_rng_state(checkpointing.load_rng_file(path))
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == want


def test_a_planted_object_is_refused_and_never_runs(tmp_path):
    path, marker = tmp_path / "rank_00000.pt", tmp_path / "ran"
    torch.save(RunsCode(marker), path)
    with pytest.raises(checkpointing.CheckpointLoadError, match="rank_00000.pt.*could run code"):
        checkpointing.load_rng_file(path)
    assert not marker.exists()
