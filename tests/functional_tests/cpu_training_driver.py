"""Run under ``torch.distributed.run --nproc_per_node 2``: the tiny Qwen3-MoE recipe, EP=2, on CPU.

One launch runs every scenario of the functional test (interpreter start-up and megatron-core's
import cost ~30 s per process on a small CI machine, so they are paid once):

1. overlap off, ``ITERS`` iterations;
2. overlap on (megatron's combined-1F1B schedule), same iterations;
3. overlap on with checkpointing every ``STOP_AT`` iterations, SIGTERM delivered during iteration
   ``STOP_AT`` on rank 0: the run must save that iteration once and stop cleanly;
4. resume from that checkpoint to ``ITERS``;
5. resume the finished run again: nothing to train, nothing saved;
6. a fresh run saving every 2 iterations whose save of iteration 4 dies after writing its shards
   and before publishing them;
7. resume from what scenario 6 left: iteration 2, trained on to 4;
8. a forward step in Megatron-Bridge's signature ``(state, data_iterator, model, ...)``, overlap on;
9. ``model.gradient_accumulation_fusion=true`` without Apex: megatron-core's layers add their weight
   gradients into ``main_grad`` through this package's kernel;
10. a resume from a copy of the finished checkpoint whose RNG files were replaced by a pickled object
    that would run code when unpickled: refused, nothing run;
11. overlap on with ``model.ep_overlap_early_attn_memory_release=true`` (megatron-core's EP-overlap
    schedule running each layer's attention backward earlier), 3 iterations.

Scenario 2's container is validated by the user first; what it holds after ``validate()`` and after
``pretrain()`` (extra attributes, copies against their owners, the saved YAML, how often it was
resolved) goes into the results too.

Rank 0 writes ``results.json`` into the output directory given as the only argument.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path

import torch
from megatron.core import dist_checkpointing

from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.config_stages.resolution import finalize
from megatron.bridge.training.gpt_step import forward_step
from megatron.bridge.training.loop import checkpointing
from megatron.bridge.training.pretrain import pretrain

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from container_facts import attributes_beyond_fields, container_extras, copies_in_saved_yaml, copies_unlike_their_owners  # noqa: E402

ITERS = 10
STOP_AT = 5


def tiny_cfg(out: Path, name: str, overlap: bool):
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.dist.device = "cpu"
    cfg.model.layer_spec = "local"
    cfg.model.expert_model_parallel_size = 2
    cfg.comm_overlap.overlap_moe_expert_parallel_comm = overlap
    cfg.train.train_iters = ITERS
    cfg.logger.log_dir = str(out / name)
    return cfg


def resume_cfg(out: Path, name: str, ckpt: Path):
    cfg = tiny_cfg(out, name, overlap=True)
    cfg.checkpoint.load = str(ckpt)
    cfg.checkpoint.save = str(ckpt)
    return cfg


def sigterm_at(iteration: int, num_microbatches: int):
    """A forward step that sends SIGTERM to this process in ``iteration`` (rank 0 only)."""
    calls = {"n": 0}
    target = (iteration - 1) * num_microbatches + 1

    def step(data_iterator, model, return_schedule_plan=False):
        calls["n"] += 1
        if calls["n"] == target and torch.distributed.get_rank() == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        return forward_step(data_iterator, model, return_schedule_plan)

    return step


class SaveLog:
    """Records every checkpoint save (rank 0's view: the iterations); can make one save die."""

    def __init__(self) -> None:
        self.iterations: list[int] = []
        self.die_at: int | None = None
        self._save = checkpointing.save_checkpoint
        self._write = dist_checkpointing.save
        checkpointing.save_checkpoint = self.save
        dist_checkpointing.save = self.write

    def save(self, cfg, model, optimizer, scheduler, state, **kwargs):
        self.iterations.append(state.iteration)
        return self._save(cfg, model, optimizer, scheduler, state, **kwargs)

    def write(self, sharded, path, *args, **kwargs):
        result = self._write(sharded, path, *args, **kwargs)
        if self.die_at is not None and self.iterations and self.iterations[-1] == self.die_at:
            raise RuntimeError(f"simulated death while saving iteration {self.die_at}")
        return result

    def take(self) -> list[int]:
        taken, self.iterations = self.iterations, []
        return taken


def container_facts(cfg) -> dict:
    """What the user's container holds now (see ``container_facts``)."""
    effective = cfg.resolve().effective  # the container's last resolution, not a new one
    return {
        "container_extras": sorted(container_extras(cfg)),
        "tree_extras": sorted(attributes_beyond_fields(cfg)),
        "copies_unlike_owners": copies_unlike_their_owners(cfg, effective),
        "copies_in_yaml": copies_in_saved_yaml(cfg),
    }


def trained_after_validate(out: Path) -> tuple[list[float], dict]:
    """Scenario 2: the user validates, then trains; the container is examined after each, and the
    resolutions of it are counted."""
    cfg = tiny_cfg(out, "on", overlap=True)
    before = sorted(attributes_beyond_fields(cfg))
    resolve, resolved = finalize.resolve_config, []

    def counted(config, *args, **kwargs):
        resolved.append(config is cfg)
        return resolve(config, *args, **kwargs)

    finalize.resolve_config = counted
    try:
        cfg.validate()
        after_validate = container_facts(cfg)
        losses = pretrain(cfg).losses
    finally:
        finalize.resolve_config = resolve
    facts = {
        "tree_extras_before": before,
        "after_validate": after_validate,
        "after_pretrain": container_facts(cfg),
        "resolutions": resolved.count(True),
    }
    return losses, facts


class RunsCode:
    """Unpickling this writes a file: what an attacker's object would do with ``os.system``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def main() -> None:
    out = Path(sys.argv[1])
    # One process group for every scenario; pretrain() reuses it and leaves it alive.
    torch.distributed.init_process_group("gloo")
    results = {}
    results["off"] = pretrain(tiny_cfg(out, "off", overlap=False)).losses
    results["on"], results["one_storage"] = trained_after_validate(out)

    saves = SaveLog()
    ckpt = out / "ckpt"
    cfg = tiny_cfg(out, "stopped", overlap=True)
    cfg.checkpoint.save = str(ckpt)
    cfg.checkpoint.save_interval = STOP_AT
    world = torch.distributed.get_world_size()
    micro = cfg.train.global_batch_size // (cfg.train.micro_batch_size * world)
    stopped = pretrain(cfg, forward_step_func=sigterm_at(STOP_AT, micro))
    results["stopped"] = stopped.losses
    results["stopped_by_signal"] = stopped.stopped_by_signal
    results["stopped_iteration"] = stopped.state.iteration
    results["stopped_saves"] = saves.take()

    resumed = pretrain(resume_cfg(out, "resumed", ckpt))
    results["resumed"] = resumed.losses
    results["resumed_iteration"] = resumed.state.iteration
    results["resumed_saves"] = saves.take()

    finished = pretrain(resume_cfg(out, "finished", ckpt))
    results["finished_iteration"] = finished.state.iteration
    results["finished_saves"] = saves.take()

    interrupted_dir = out / "ckpt_interrupted"
    cfg = tiny_cfg(out, "interrupted", overlap=True)
    cfg.train.train_iters = 4
    cfg.checkpoint.save = str(interrupted_dir)
    cfg.checkpoint.save_interval = 2
    saves.die_at = 4
    try:
        pretrain(cfg)
        results["interrupted_error"] = None
    except RuntimeError as exc:
        results["interrupted_error"] = str(exc)
    saves.die_at = None
    results["interrupted_saves"] = saves.take()
    results["interrupted_left"] = sorted(p.name for p in interrupted_dir.iterdir())
    cfg = resume_cfg(out, "after_interrupted", interrupted_dir)
    cfg.train.train_iters = 4
    after = pretrain(cfg)
    results["after_interrupted"] = after.losses
    results["after_interrupted_saves"] = saves.take()
    results["after_interrupted_left"] = sorted(p.name for p in interrupted_dir.iterdir())
    seen_iterations: list[int] = []

    def state_first_step(state, data_iterator, model, return_schedule_plan=False):
        seen_iterations.append(state.train_state.iteration)
        return forward_step(data_iterator, model, return_schedule_plan)

    cfg = tiny_cfg(out, "state_first_step", overlap=True)
    cfg.train.train_iters = 3
    results["state_first_step"] = pretrain(cfg, forward_step_func=state_first_step).losses
    results["state_first_step_iterations"] = sorted(set(seen_iterations))
    planted = out / "ckpt_planted"
    if torch.distributed.get_rank() == 0:
        shutil.copytree(ckpt, planted)
        for rank in range(torch.distributed.get_world_size()):  # every rank meets it (none waits for a peer)
            torch.save(
                RunsCode(str(out / "planted_code_ran")), planted / "iter_0000010" / "rng" / f"rank_{rank:05d}.pt"
            )
    torch.distributed.barrier()
    try:
        pretrain(resume_cfg(out, "planted", planted))
        results["planted_error"] = None
    except checkpointing.CheckpointLoadError as exc:
        results["planted_error"] = str(exc)
    results["planted_code_ran"] = (out / "planted_code_ran").exists()
    cfg = tiny_cfg(out, "gaf", overlap=False)
    cfg.model.gradient_accumulation_fusion = True
    results["gaf"] = pretrain(cfg).losses
    cfg = tiny_cfg(out, "early_attn_release", overlap=True)
    cfg.model.ep_overlap_early_attn_memory_release = True
    cfg.train.train_iters = 3
    results["early_attn_release"] = pretrain(cfg).losses
    if torch.distributed.get_rank() == 0:
        (out / "results.json").write_text(json.dumps(results, indent=2))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
