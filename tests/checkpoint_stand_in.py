"""A checkpoint directory on disk with every file the resume checks look for (as stand-ins), for
tests of what is decided about a checkpoint before anything loads it."""

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def saved_checkpoint(root: Path, iteration: int, layout: dict[str, Any], drop: Iterable[str] = ()) -> Path:
    """``root`` with ``iteration`` as its latest saved iteration written with ``layout``: tracker,
    the common files, the layout record and one RNG file per rank, less the names in ``drop``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    saved = root / f"iter_{iteration:07d}"
    (saved / "rng").mkdir(parents=True, exist_ok=True)
    world = 1
    for size in ("tp", "pp", "cp", "dp"):
        world *= layout.get(size, 1)
    files = {"metadata.json": "{}", ".metadata": "x", "parallel_layout.json": json.dumps(layout)}
    files.update({f"rng/rank_{rank:05d}.pt": "x" for rank in range(world)})
    for name, text in files.items():
        if name not in set(drop):
            (saved / name).write_text(text)
    return root
