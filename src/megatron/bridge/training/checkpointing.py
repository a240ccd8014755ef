"""Save and resume with megatron-core ``dist_checkpointing`` (``torch_dist`` format).

Layout under ``cfg.checkpoint.save``::

    iter_0000010/            one dist_checkpointing directory per saved iteration
        ...                  model + optimizer shards, common state (scheduler, iteration,
                             consumed samples)
        rng/rank_00000.pt    per-rank RNG states (python, numpy, torch, CUDA tracker)
        parallel_layout.json the layout that wrote it (a resume with another layout is refused)
    latest_checkpointed_iteration.txt

A save never touches a published checkpoint while it writes: every rank writes into
``iter_0000010.incomplete``, then rank 0 renames it to ``iter_0000010`` and only then replaces the
tracker file (atomically). A save killed midway leaves the previous checkpoint and the tracker as
they were; the next save of that iteration starts the staging directory afresh.

``load_checkpoint`` resumes from the iteration named in ``latest_checkpointed_iteration.txt`` in
``cfg.checkpoint.load``; :class:`CheckpointSaver` is a run's cadence (save interval, save on exit,
each iteration at most once). :func:`inspect_checkpoint_dir` tells validation, before anything is
launched, whether a directory holds a checkpoint, is empty, or is not a checkpoint directory.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional

import numpy as np
import torch

from megatron.bridge.training.save_lock import LOCK_NAME, SaveDirInUseError, SaveDirLock

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

logger = logging.getLogger(__name__)

TRACKER = "latest_checkpointed_iteration.txt"
LAYOUT_FILE = "parallel_layout.json"
STAGING_SUFFIX = ".incomplete"
REPLACED_SUFFIX = ".replaced"
# DP-local optimizer shards: no gathers on save or load.
# ("fully_sharded_model_space", megatron's default, fails in 0.19.2: "ShardedTensor.flattened_range is
# not supported".)
OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "dp_reshardable", "chained_optim_avoid_prefix": True}


@dataclass
class TrainState:
    """What a checkpoint must restore besides model and optimizer."""

    iteration: int = 0
    consumed_samples: int = 0


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


def _bare(model: list[Any]) -> list[Any]:
    """The ``GPTModel`` inside each DDP/Float16Module chunk.

    megatron's DDP wrapper has no ``sharded_state_dict`` of its own, so asking it adds a
    ``module.`` prefix that its ``load_state_dict`` does not strip; the bare model has neither
    problem, and its keys are megatron's usual checkpoint keys.
    """
    from megatron.core.utils import unwrap_model

    return unwrap_model(model)


def _sharded_state_dict(model: list[Any], optimizer: Any, is_loading: bool) -> dict[str, Any]:
    bare = _bare(model)
    state: dict[str, Any] = {}
    if len(bare) == 1:
        state["model"] = bare[0].sharded_state_dict()
        model_state = state["model"]
    else:
        model_state = {}
        for i, chunk in enumerate(bare):
            state[f"model{i}"] = chunk.sharded_state_dict()
            model_state.update(state[f"model{i}"])
    state["optimizer"] = optimizer.sharded_state_dict(
        model_state, is_loading=is_loading, metadata=OPTIMIZER_METADATA
    )
    return state


class CheckpointLoadError(RuntimeError):
    """A checkpoint that cannot be resumed from, with the file that says why."""


def _rng_state() -> dict[str, Any]:
    """Every RNG state of this rank as tensors, numbers and strings only: a resume reads it with
    ``torch.load(weights_only=True)``, which builds no other object (a pickled one could run code)."""
    from megatron.core import tensor_parallel

    version, mt_words, gauss = random.getstate()
    kind, np_words, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "random": {"version": version, "words": torch.tensor(mt_words, dtype=torch.int64), "gauss": gauss},
        "numpy": {"kind": kind, "words": torch.from_numpy(np_words.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
        state["tracker"] = dict(tensor_parallel.get_cuda_rng_tracker().get_states())
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    from megatron.core import tensor_parallel

    py = state["random"]
    random.setstate((py["version"], tuple(int(w) for w in py["words"].tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state((npy["kind"], npy["words"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"],
                         npy["cached"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
        tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


def load_rng_file(path: Path) -> dict[str, Any]:
    """A rank's saved RNG states; never runs code from the file (``weights_only=True``).

    A file that holds anything but tensors, numbers and strings (an object planted to run code on
    resume, or a checkpoint of a release that pickled numpy arrays) is refused with its name."""
    try:
        return torch.load(path, weights_only=True)
    except Exception as exc:  # torch's UnpicklingError names the refused global
        raise CheckpointLoadError(
            f"{path} holds more than tensors, numbers and strings and is not loaded (loading it could run "
            f"code): {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}. Resume only from "
            "checkpoints you trust, or start the run fresh without checkpoint.load"
        ) from None


def _without_psutil() -> None:
    """megatron-core's torch_dist writer logs process memory through ``psutil`` and fails without it.

    The value is only logged, so when ``psutil`` is absent (it is no dependency of torch or
    megatron-core) report the peak resident set size from the standard library instead.
    """
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if getattr(filesystem_async, "HAVE_PSUTIL", True):
        return
    import resource

    filesystem_async._process_memory = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _in_process_results_queue() -> None:
    """Keep megatron's checkpoint writer from starting a ``spawn`` multiprocessing Manager.

    ``FileSystemWriterAsync`` collects its writers' results through a Manager queue created with
    the ``spawn`` start method: a fresh interpreter that re-imports the training script (tens of
    seconds with torch and megatron-core). We save synchronously, where the writers are threads of
    this process, so a plain in-process queue carries the same results.
    """
    import queue

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if getattr(filesystem_async, "_results_queue", None) is None:
        filesystem_async._results_queue = queue.Queue()


def _fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_tracker(root: Path, iteration: int) -> None:
    """Point ``root``'s tracker at ``iteration`` atomically (a reader sees the old or the new one)."""
    tmp = root / f"{TRACKER}.tmp"
    with open(tmp, "w") as handle:
        handle.write(str(iteration))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, root / TRACKER)
    _fsync_dir(root)


def publish(staging: Path, final: Path) -> None:
    """Rename a completely written ``staging`` directory to ``final`` (rank 0, before the tracker).

    An older ``final`` (a previous run's checkpoint of the same iteration in this directory) is
    renamed aside first and deleted once the new one is in place.
    """
    replaced = final.with_name(final.name + REPLACED_SUFFIX)
    if final.exists():
        shutil.rmtree(replaced, ignore_errors=True)
        os.rename(final, replaced)
    os.rename(staging, final)
    _fsync_dir(final.parent)
    shutil.rmtree(replaced, ignore_errors=True)


def save_checkpoint(
    cfg: "ConfigContainer", model: list[Any], optimizer: Any, scheduler: Any, state: "TrainState",
    run_id: str = "run",
) -> Path:
    """Save model, optimizer, scheduler, iteration, data position and RNG at ``state.iteration``.

    Written into this run's staging directory, published by rename, tracker replaced last.
    """
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps

    _without_psutil()
    _in_process_results_queue()
    if cfg.ddp.use_distributed_optimizer:
        # Every replica must hold the same (latest) parameters before shards are written.
        for chunk in model:
            chunk.start_param_sync(force_sync=True)
    root = Path(cfg.checkpoint.save)
    final = iteration_dir(root, state.iteration)
    staging = staging_dir(final, run_id)
    rank = torch.distributed.get_rank()
    if rank == 0:
        remove_leftover_staging(root)  # saves that were killed; this run holds the directory's lock
        staging.mkdir(parents=True)
    torch.distributed.barrier()
    sharded = _sharded_state_dict(model, optimizer, is_loading=False)
    sharded["scheduler"] = scheduler.state_dict()
    sharded["iteration"] = state.iteration
    sharded["consumed_samples"] = state.consumed_samples
    dist_checkpointing.save(sharded, str(staging))
    rng_dir = staging / "rng"
    rng_dir.mkdir(exist_ok=True)
    torch.save(_rng_state(), rng_dir / f"rank_{rank:05d}.pt")
    torch.distributed.barrier()
    if rank == 0:
        layout = checkpoint_layout(cfg, ps.get_data_parallel_world_size())
        (staging / LAYOUT_FILE).write_text(json.dumps(layout, indent=2))
        publish(staging, final)
        write_tracker(root, state.iteration)
        print(f"[megatron.bridge] saved checkpoint at iteration {state.iteration} to {final}", flush=True)
    torch.distributed.barrier()
    return final


def _prime_optimizer_state(optimizer: Any) -> None:
    """Give a fresh torch Adam inside megatron's optimizer its state (zeros, ``step`` 0) before loading.

    Without Apex/TE, megatron's ``DistributedOptimizer.state_dict()`` reads the ``step`` of every
    parameter state and asserts there is exactly one value; a never-stepped torch optimizer has no
    state at all, so building the *loading* state dict of a fresh run fails. The values written
    here are placeholders, overwritten by the checkpoint.
    """
    from megatron.core.optimizer import distrib_optimizer

    if getattr(distrib_optimizer, "HAVE_APEX_OR_TE", False):
        return
    for sub in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(sub, "optimizer", None)
        if inner is None or len(inner.state) > 0:
            continue
        init_state_fn = getattr(sub, "init_state_fn", None)
        if init_state_fn is not None:
            init_state_fn(inner, getattr(sub, "config", None))
        for group in inner.param_groups:
            for param in group["params"]:
                inner.state[param].setdefault("step", torch.tensor(0.0))


def _restore_adam_steps(optimizer: Any) -> None:
    """Put the checkpoint's Adam ``step`` back into every parameter state of torch's Adam.

    megatron's ``dp_reshardable`` loader copies each parameter's state tensors from a structure
    built out of the *live* (primed, step 0) optimizer, so the per-parameter ``step`` tensor keeps
    the placeholder; the true step is in the loaded param groups. Bias correction needs it.
    """
    from megatron.core.optimizer import distrib_optimizer

    if getattr(distrib_optimizer, "HAVE_APEX_OR_TE", False):
        return
    for sub in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(sub, "optimizer", None)
        if inner is None:
            continue
        for group in inner.param_groups:
            if group.get("step") is None:
                continue
            for param in group["params"]:
                if "step" in inner.state.get(param, {}):
                    inner.state[param]["step"] = torch.tensor(float(group["step"]))


def load_checkpoint(
    cfg: "ConfigContainer", model: list[Any], optimizer: Any, scheduler: Any
) -> Optional[tuple["TrainState", Path]]:
    """Restore the latest checkpoint in ``cfg.checkpoint.load``: the train state and the directory
    it came from, or ``None`` when the directory holds no checkpoint yet."""
    from megatron.core import dist_checkpointing

    iteration = latest_iteration(cfg.checkpoint.load)
    if iteration is None:
        return None
    path = iteration_dir(cfg.checkpoint.load, iteration)
    _prime_optimizer_state(optimizer)
    sharded = _sharded_state_dict(model, optimizer, is_loading=True)
    loaded = dist_checkpointing.load(sharded, str(path))
    bare = _bare(model)
    if len(bare) == 1:
        bare[0].load_state_dict(loaded["model"], strict=True)
    else:
        for i, chunk in enumerate(bare):
            chunk.load_state_dict(loaded[f"model{i}"], strict=True)
    optimizer.load_state_dict(loaded["optimizer"])
    _restore_adam_steps(optimizer)
    common = dist_checkpointing.load_common_state_dict(str(path))
    scheduler.load_state_dict(common["scheduler"])
    rng_file = path / "rng" / f"rank_{torch.distributed.get_rank():05d}.pt"
    if not rng_file.is_file():
        raise CheckpointLoadError(
            f"{rng_file} is missing: every rank's RNG state is part of the checkpoint, and without it the "
            "resumed run would not continue the saved one. Restore the file, or resume from another iteration"
        )
    _set_rng_state(load_rng_file(rng_file))
    state = TrainState(iteration=int(common["iteration"]), consumed_samples=int(common["consumed_samples"]))
    return state, path


def hold_save_dir(resolved: "ConfigContainer", device: torch.device) -> tuple[Optional[SaveDirLock], str]:
    """Rank 0 takes ``checkpoint.save``'s lock for this run; every rank gets the run's id (its staging
    directories' name) or the same :class:`SaveDirInUseError`, so no rank waits for a peer that stopped."""
    if not resolved.checkpoint.save:
        return None, "run"
    lock, outcome = None, None
    if torch.distributed.get_rank() == 0:
        try:
            lock = SaveDirLock(resolved.checkpoint.save).acquire()
            outcome = ("ok", lock.run_id, lock.note)
        except SaveDirInUseError as exc:
            outcome = ("in_use", str(exc), None)
    shared = [outcome]
    torch.distributed.broadcast_object_list(shared, src=0, device=device)
    kind, value, note = shared[0]
    if kind == "in_use":
        raise SaveDirInUseError(value)
    if note and torch.distributed.get_rank() == 0:
        _announce(note)
    return lock, value


def _announce(line: str) -> None:
    print(f"[megatron.bridge] {line}", flush=True)




class CheckpointSaver:
    """Saves each iteration at most once and remembers which checkpoint holds the current state.

    The state a run resumes from is already on disk, so a run that resumes and stops (or ends)
    without training writes nothing; a stop on a save-interval iteration saves that iteration once.
    """

    def __init__(self, resolved: "ConfigContainer", model: list[Any], optimizer: Any, scheduler: Any,
                 run_id: str = "run") -> None:
        self.resolved, self.model, self.optimizer, self.scheduler = resolved, model, optimizer, scheduler
        self.run_id = run_id
        self.persisted_iteration = 0
        self.path: Optional[Any] = None

    def resume(self, announce: bool) -> TrainState:
        """Load ``checkpoint.load`` when it holds a checkpoint; say what the run starts from."""
        ckpt = self.resolved.checkpoint
        loaded = load_checkpoint(self.resolved, self.model, self.optimizer, self.scheduler) if ckpt.load else None
        if loaded is None:
            if announce and ckpt.load:
                _announce(f"no checkpoint in {ckpt.load} yet: starting from iteration 0")
            return TrainState()
        state, self.path = loaded
        self.persisted_iteration = state.iteration
        if announce:
            _announce(f"resumed from iteration {state.iteration} ({self.path})")
            if state.iteration >= self.resolved.train.train_iters:
                _announce(f"nothing to train: train.train_iters={self.resolved.train.train_iters}")
        return state

    def interval_due(self, iteration: int) -> bool:
        interval = self.resolved.checkpoint.save_interval
        return bool(interval) and iteration % interval == 0

    def exit_due(self, iteration: int) -> bool:
        return self.resolved.checkpoint.save_on_exit or self.interval_due(iteration)

    def save(self, state: TrainState) -> None:
        """Save ``state`` unless it is already on disk (or no save directory is set)."""
        if not self.resolved.checkpoint.save or state.iteration == self.persisted_iteration:
            return
        self.path = save_checkpoint(self.resolved, self.model, self.optimizer, self.scheduler, state, run_id=self.run_id)
        self.persisted_iteration = state.iteration
