"""``TrainState``: where a run is, besides model and optimizer (what a checkpoint restores)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainState:
    """What a checkpoint must restore besides model and optimizer."""

    iteration: int = 0
    consumed_samples: int = 0
