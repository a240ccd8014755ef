"""Save and resume with megatron-core ``dist_checkpointing`` (``torch_dist`` format).

Layout under ``cfg.checkpoint.save``::

    iter_0000010/            one dist_checkpointing directory per saved iteration
        ...                  model + optimizer shards, common state (scheduler, iteration,
                             consumed samples)
        rng/rank_00000.pt    per-rank RNG states (python, numpy, torch, CUDA tracker)
        parallel_layout.json the layout that wrote it (a resume with another layout is refused)
    latest_checkpointed_iteration.txt

A save never touches a published checkpoint while it writes: every rank writes into
``iter_0000010.incomplete.<run id>``, then rank 0 renames it to ``iter_0000010`` and only then
replaces the tracker file (atomically). A save killed midway leaves the previous checkpoint and the
tracker as they were; the next save removes the leftover staging directory. One run at a time holds
the save directory (:mod:`megatron.bridge.training.loop.save_lock`).

``load_checkpoint`` resumes from the iteration named in ``latest_checkpointed_iteration.txt`` in
``cfg.checkpoint.load``; :class:`CheckpointSaver` is a run's cadence (save interval, save on exit,
each iteration at most once). What a directory holds, read without torch, is
:mod:`megatron.bridge.training.config_stages.facts.checkpoint_dir`.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import random
import resource
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from megatron.core import dist_checkpointing, tensor_parallel
from megatron.core import parallel_state as ps
from megatron.core.dist_checkpointing.strategies import filesystem_async
from megatron.core.optimizer import distrib_optimizer
from megatron.core.utils import unwrap_model

from megatron.bridge.training.config_stages.facts.checkpoint_dir import (
    LAYOUT_FILE,
    REPLACED_SUFFIX,
    STAGING_SUFFIX,
    TRACKER,
    checkpoint_layout,
    iteration_dir,
    latest_iteration,
    staging_dir,
)
from megatron.bridge.training.loop.save_lock import SaveDirInUseError, SaveDirLock
from megatron.bridge.utils.owned_files import (
    UnsafePathError,
    create_new,
    fsync_dir,
    make_dir,
    make_fresh_dir,
    open_new,
    remove,
    replace_file,
)

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

logger = logging.getLogger(__name__)

# DP-local optimizer shards: no gathers on save or load.
# ("fully_sharded_model_space", megatron's default, fails in 0.19.2: "ShardedTensor.flattened_range is
# not supported".)
OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "dp_reshardable", "chained_optim_avoid_prefix": True}


def remove_leftover_staging(root: Path) -> None:
    """Staging directories of saves that were killed; only called by the run holding the directory's
    lock, so none of them is being written."""
    for child in root.glob(f"iter_*{STAGING_SUFFIX}*"):
        shutil.rmtree(child, ignore_errors=True)


@dataclass
class TrainState:
    """What a checkpoint must restore besides model and optimizer."""

    iteration: int = 0
    consumed_samples: int = 0


def _bare(model: list[Any]) -> list[Any]:
    """The ``GPTModel`` inside each DDP/Float16Module chunk.

    megatron's DDP wrapper has no ``sharded_state_dict`` of its own, so asking it adds a
    ``module.`` prefix that its ``load_state_dict`` does not strip; the bare model has neither
    problem, and its keys are megatron's usual checkpoint keys.
    """

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
    state["optimizer"] = optimizer.sharded_state_dict(model_state, is_loading=is_loading, metadata=OPTIMIZER_METADATA)
    return state


class CheckpointLoadError(RuntimeError):
    """A checkpoint that cannot be resumed from, with the file that says why."""


def _rng_state() -> dict[str, Any]:
    """Every RNG state of this rank as tensors, numbers and strings only: a resume reads it with
    ``torch.load(weights_only=True)``, which builds no other object (a pickled one could run code)."""

    version, mt_words, gauss = random.getstate()
    kind, np_words, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "random": {"version": version, "words": torch.tensor(mt_words, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "kind": kind,
            "words": torch.from_numpy(np_words.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
        state["tracker"] = dict(tensor_parallel.get_cuda_rng_tracker().get_states())
    return state


def _set_rng_state(state: dict[str, Any]) -> None:

    py = state["random"]
    random.setstate((py["version"], tuple(int(w) for w in py["words"].tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state(
        (npy["kind"], npy["words"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"], npy["cached"])
    )
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

    if getattr(filesystem_async, "HAVE_PSUTIL", True):
        return

    filesystem_async._process_memory = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _in_process_results_queue() -> None:
    """Keep megatron's checkpoint writer from starting a ``spawn`` multiprocessing Manager.

    ``FileSystemWriterAsync`` collects its writers' results through a Manager queue created with
    the ``spawn`` start method: a fresh interpreter that re-imports the training script (tens of
    seconds with torch and megatron-core). We save synchronously, where the writers are threads of
    this process, so a plain in-process queue carries the same results.
    """

    if getattr(filesystem_async, "_results_queue", None) is None:
        filesystem_async._results_queue = queue.Queue()


def write_tracker(root: Path, iteration: int) -> None:
    """Point ``root``'s tracker at ``iteration`` atomically (a reader sees the old or the new one; a
    link planted at its name is replaced, never written through)."""
    replace_file(root / TRACKER, str(iteration), durable=True)


def publish(staging: Path, final: Path) -> None:
    """Rename a completely written ``staging`` directory to ``final`` (rank 0, before the tracker).

    An older ``final`` (a previous run's checkpoint of the same iteration in this directory) is
    renamed aside first and deleted once the new one is in place. Renames and removals act on names,
    never through links (``owned_files``).
    """
    replaced = final.with_name(final.name + REPLACED_SUFFIX)
    if os.path.lexists(final):
        remove(replaced)
        os.rename(final, replaced)
    os.chmod(staging, 0o777 & ~_umask())  # written private, published with the user's usual mode
    os.rename(staging, final)
    fsync_dir(final.parent)
    remove(replaced)


def _umask() -> int:
    """The process's umask, read without changing it (``os.umask`` would, for every thread)."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        return 0o022


def save_checkpoint(
    cfg: ConfigContainer,
    model: list[Any],
    optimizer: Any,
    scheduler: Any,
    state: TrainState,
    run_id: str = "run",
) -> Path:
    """Save model, optimizer, scheduler, iteration, data position and RNG at ``state.iteration``.

    Written into this run's staging directory, published by rename, tracker replaced last.
    """

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
        make_dir(root, parents=True)
        make_fresh_dir(staging, private=True)  # nobody else can plant a name in it while it is written
    torch.distributed.barrier()
    sharded = _sharded_state_dict(model, optimizer, is_loading=False)
    sharded["scheduler"] = scheduler.state_dict()
    sharded["iteration"] = state.iteration
    sharded["consumed_samples"] = state.consumed_samples
    dist_checkpointing.save(sharded, str(staging))
    rng_dir = make_dir(staging / "rng")
    with open_new(rng_dir / f"rank_{rank:05d}.pt", "wb") as handle:
        torch.save(_rng_state(), handle)
    torch.distributed.barrier()
    if rank == 0:
        layout = checkpoint_layout(cfg, ps.get_data_parallel_world_size())
        create_new(staging / LAYOUT_FILE, json.dumps(layout, indent=2))
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
    cfg: ConfigContainer, model: list[Any], optimizer: Any, scheduler: Any
) -> tuple[TrainState, Path] | None:
    """Restore the latest checkpoint in ``cfg.checkpoint.load``: the train state and the directory
    it came from, or ``None`` when the directory holds no checkpoint yet."""

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


def hold_save_dir(resolved: ConfigContainer, device: torch.device) -> tuple[SaveDirLock | None, str]:
    """Rank 0 takes ``checkpoint.save``'s lock for this run; every rank gets the run's id (its staging
    directories' name) or the same :class:`SaveDirInUseError`, so no rank waits for a peer that stopped."""
    if not resolved.checkpoint.save:
        return None, "run"
    lock, outcome = None, None
    if torch.distributed.get_rank() == 0:
        try:
            lock = SaveDirLock(resolved.checkpoint.save).acquire()
            outcome = ("ok", lock.run_id, lock.note)
        except (SaveDirInUseError, UnsafePathError) as exc:
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

    def __init__(
        self, resolved: ConfigContainer, model: list[Any], optimizer: Any, scheduler: Any, run_id: str = "run"
    ) -> None:
        self.resolved, self.model, self.optimizer, self.scheduler = resolved, model, optimizer, scheduler
        self.run_id = run_id
        self.persisted_iteration = 0
        self.path: Any | None = None

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
        self.path = save_checkpoint(
            self.resolved, self.model, self.optimizer, self.scheduler, state, run_id=self.run_id
        )
        self.persisted_iteration = state.iteration
