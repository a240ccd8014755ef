"""What a checkpoint directory holds, read from disk without torch or a process group.

The names written under ``checkpoint.save`` (one ``iter_NNNNNNN`` per saved iteration, the tracker
file, the layout record, the per-run staging directories) and :func:`inspect_checkpoint_dir`, which
tells validation before anything is launched whether a directory holds a complete checkpoint, is
empty, or is not a checkpoint directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional

from megatron.bridge.training.loop.save_lock import LOCK_NAME

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

TRACKER = "latest_checkpointed_iteration.txt"
LAYOUT_FILE = "parallel_layout.json"
STAGING_SUFFIX = ".incomplete"
REPLACED_SUFFIX = ".replaced"


def iteration_dir(root: str | os.PathLike, iteration: int) -> Path:
    return Path(root) / f"iter_{iteration:07d}"


def latest_iteration(root: Optional[str | os.PathLike]) -> Optional[int]:
    """The last completely saved iteration under ``root``, or ``None``."""
    if not root:
        return None
    tracker = Path(root) / TRACKER
    if not tracker.is_file():
        return None
    text = tracker.read_bytes().strip()  # bytes: a damaged file is "not a number", never a decode error
    return int(text) if re.fullmatch(rb"[0-9]+", text) else None


CheckpointDirKind = Literal["missing", "not_a_directory", "empty", "checkpoint", "bad_tracker",
                            "tracker_without_iteration", "iteration_dir", "no_tracker", "incomplete"]


@dataclass(frozen=True)
class CheckpointDir:
    """What a ``checkpoint.load`` directory holds, read without torch.distributed."""

    path: Path
    kind: CheckpointDirKind
    iteration: Optional[int] = None
    layout: Optional[dict[str, Any]] = None
    """The parallel layout recorded with the latest checkpoint (``None`` when not recorded)."""
    missing: tuple[str, ...] = ()
    """Files of the latest checkpoint a resume needs that are absent or unreadable (``incomplete``)."""

    @property
    def resumable(self) -> bool:
        return self.kind == "checkpoint"


def _looks_like_iteration_dir(path: Path) -> bool:
    """Named like one saved iteration, or holding what dist_checkpointing writes into one."""
    return bool(re.fullmatch(r"iter_\d{7}", path.name)) or any(
        (path / name).is_file() for name in ("metadata.json", "common.pt")
    )


def _leftover(child: Path) -> bool:
    """What a save killed before publishing its first checkpoint leaves behind (and the lock of a run
    that is gone: a live one is refused by its own rule)."""
    return STAGING_SUFFIX in child.name or child.name in (f"{TRACKER}.tmp", LOCK_NAME)


def staging_dir(final: Path, run_id: str) -> Path:
    """Where one run writes a save of ``final`` before publishing it: named for the run, so a save can
    never write into, or remove, another run's staging directory."""
    return final.with_name(f"{final.name}{STAGING_SUFFIX}.{run_id}")


def remove_leftover_staging(root: Path) -> None:
    """Staging directories of saves that were killed; only called by the run holding the directory's
    lock, so none of them is being written."""
    for child in root.glob(f"iter_*{STAGING_SUFFIX}*"):
        shutil.rmtree(child, ignore_errors=True)


def _read_layout(path: Path) -> Optional[dict[str, Any]]:
    try:
        layout = json.loads((path / LAYOUT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return layout if isinstance(layout, dict) else None


COMMON_FILES = ("metadata.json", ".metadata")
"""What megatron-core's ``torch_dist`` writer puts into every saved iteration besides the shards."""


def _saved_world_size(layout: dict[str, Any]) -> Optional[int]:
    sizes = [layout.get(k) for k in ("tp", "pp", "cp", "dp")]
    return None if any(not isinstance(v, int) for v in sizes) else sizes[0] * sizes[1] * sizes[2] * sizes[3]


def missing_files(iteration: Path) -> tuple[str, ...]:
    """What a resume needs from one saved iteration and does not find: the common files, the layout
    record (without it the layout check could not run) and every rank's RNG state."""
    missing = [name for name in COMMON_FILES if not (iteration / name).is_file()]
    layout = _read_layout(iteration)
    if layout is None:
        missing.append(f"{LAYOUT_FILE} (absent or not a layout)")
        return tuple(missing)
    world = _saved_world_size(layout)
    ranks = range(world) if world else ()
    missing += [f"rng/rank_{r:05d}.pt" for r in ranks if not (iteration / "rng" / f"rank_{r:05d}.pt").is_file()]
    return tuple(missing)


def inspect_checkpoint_dir(root: str | os.PathLike) -> CheckpointDir:
    """Classify ``root`` as a resume source (no process group, no torch I/O)."""
    path = Path(root)
    if not path.exists():
        return CheckpointDir(path, "missing")
    if not path.is_dir():
        return CheckpointDir(path, "not_a_directory")
    tracker = path / TRACKER
    if tracker.is_file():
        iteration = latest_iteration(path)
        if iteration is None:
            return CheckpointDir(path, "bad_tracker")
        saved = iteration_dir(path, iteration)
        if not saved.is_dir():
            return CheckpointDir(path, "tracker_without_iteration", iteration)
        missing = missing_files(saved)
        if missing:
            return CheckpointDir(path, "incomplete", iteration, _read_layout(saved), missing)
        return CheckpointDir(path, "checkpoint", iteration, _read_layout(saved))
    if _looks_like_iteration_dir(path):
        return CheckpointDir(path, "iteration_dir")
    if all(_leftover(child) for child in path.iterdir()):
        return CheckpointDir(path, "empty")
    return CheckpointDir(path, "no_tracker")


def checkpoint_layout(cfg: "ConfigContainer", data_parallel_size: Optional[int]) -> dict[str, Optional[int]]:
    """The parallel sizes that decide how model and optimizer state are sharded on disk.

    Saved with every checkpoint and compared on resume: this package's optimizer format is only
    loaded back under the layout that wrote it (resharding is not supported here).
    """
    m = cfg.model
    return dict(
        tp=m.tensor_model_parallel_size,
        pp=m.pipeline_model_parallel_size,
        vpp=m.virtual_pipeline_model_parallel_size,
        cp=m.context_parallel_size,
        ep=m.expert_model_parallel_size,
        etp=m.expert_tensor_parallel_size or m.tensor_model_parallel_size,
        dp=data_parallel_size,
    )
