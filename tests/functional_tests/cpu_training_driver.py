"""Run under ``torch.distributed.run --nproc_per_node 2``: the tiny Qwen3-MoE recipe, EP=2, on CPU.

One launch runs every scenario of the functional test (interpreter start-up and megatron-core's
import cost ~30 s per process on a small CI machine, so they are paid once):

1. overlap off, ``ITERS`` iterations;
2. overlap on (megatron's combined-1F1B schedule), same iterations;
3. overlap on with checkpointing, SIGTERM delivered during iteration ``STOP_AT`` on rank 0:
   the run must save and stop cleanly;
4. resume from that checkpoint to ``ITERS``.

Rank 0 writes ``results.json`` into the output directory given as the only argument.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch

from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.gpt_step import forward_step
from megatron.bridge.training.pretrain import pretrain

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


def main() -> None:
    out = Path(sys.argv[1])
    # One process group for every scenario; pretrain() reuses it and leaves it alive.
    torch.distributed.init_process_group("gloo")
    results = {}
    results["off"] = pretrain(tiny_cfg(out, "off", overlap=False)).losses
    results["on"] = pretrain(tiny_cfg(out, "on", overlap=True)).losses

    ckpt = out / "ckpt"
    cfg = tiny_cfg(out, "stopped", overlap=True)
    cfg.checkpoint.save = str(ckpt)
    world = torch.distributed.get_world_size()
    micro = cfg.train.global_batch_size // (cfg.train.micro_batch_size * world)
    stopped = pretrain(cfg, forward_step_func=sigterm_at(STOP_AT, micro))
    results["stopped"] = stopped.losses
    results["stopped_by_signal"] = stopped.stopped_by_signal
    results["stopped_iteration"] = stopped.state.iteration

    cfg = tiny_cfg(out, "resumed", overlap=True)
    cfg.checkpoint.load = str(ckpt)
    cfg.checkpoint.save = str(ckpt)
    resumed = pretrain(cfg)
    results["resumed"] = resumed.losses
    results["resumed_iteration"] = resumed.state.iteration
    if torch.distributed.get_rank() == 0:
        (out / "results.json").write_text(json.dumps(results, indent=2))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
