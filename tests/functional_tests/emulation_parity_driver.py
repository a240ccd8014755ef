"""One training step of the tiny Qwen3-MoE recipe at EP=2 on CPU, in a real world or an emulated one.

    python -m torch.distributed.run --nproc-per-node 2 emulation_parity_driver.py real OUT
    python emulation_parity_driver.py emulated OUT
    python emulation_parity_driver.py record OUT

Every rank reads the same micro-batches (a symmetric world, which the emulated one plays), so the
real rank 0 and the emulated rank 0 must issue the same collectives and hand their local experts
the same number of tokens. One layer: what a second layer routes depends on what the peers' experts
returned in the first, which the emulated world fills with stand-ins (the same shapes, other values). The real
world runs over gloo behind a recording process group (this file) that writes down each collective as the
emulated backend's record does: kind, megatron-core group, bytes (all-reduce and broadcast: the tensors;
all-gather: the output; reduce-scatter: the input; all-to-all: what goes to other ranks). Rank 0 writes
``OUT/<mode>.json``: the first step's collectives in order, the token counts of each local-expert call, and
the losses.

``record``: one step of the tiny recipe (two layers, two micro-batches) as rank 0 of an emulated
EP=4 / DP=4 world with one GPU per node on ``h100_ib400``; writes the step's record
(``OUT/record.json``), which the test compares with the network model worked out by hand.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo

import megatron.bridge.training.loop.trainer as trainer_module
import megatron.bridge.training.pretrain as pretrain_module
from megatron.bridge.emulation.group_names import megatron_group_names
from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.gpt_step import forward_step

ORDER: list[tuple] = []
"""``(kind, group object, bytes)`` of the real world's collectives since the model was built."""
EXPERT_TOKENS: list[list[int]] = []


def _nb(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class RecordingGloo(dist.ProcessGroup):
    """gloo, with every collective written down first."""

    def __init__(self, opts, backend_options=None) -> None:
        super().__init__(opts.group_rank, opts.group_size)
        self.inner = ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)
        self.me, self.n, self.name_ = opts.group_rank, opts.group_size, opts.group_id

    @property
    def group_name(self) -> str:
        return self.name_

    def getBackendName(self) -> str:
        return "recording_gloo"

    def _note(self, kind: str, nbytes: int) -> None:
        ORDER.append((kind, self, nbytes))

    def allreduce(self, tensors, opts):
        self._note("all_reduce", sum(map(_nb, tensors)))
        return self.inner.allreduce(tensors, opts)

    def allreduce_coalesced(self, tensors, opts):
        self._note("all_reduce", sum(map(_nb, tensors)))
        return self.inner.allreduce_coalesced(tensors, opts)

    def allgather(self, outputs, inputs, opts):
        self._note("all_gather", sum(_nb(t) * self.n for t in inputs))
        return self.inner.allgather(outputs, inputs, opts)

    def all_gather_single(self, output, tensor, opts):
        self._note("all_gather", _nb(output))
        return self.inner.all_gather_single(output, tensor, opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        self._note("all_gather", sum(map(_nb, outputs)))
        return self.inner.all_gather_single_coalesced(outputs, inputs, opts)

    def reduce_scatter_single(self, output, tensor, opts):
        self._note("reduce_scatter", _nb(tensor))
        return self.inner.reduce_scatter_single(output, tensor, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        self._note("reduce_scatter", sum(map(_nb, inputs)))
        return self.inner.reduce_scatter_single_coalesced(outputs, inputs, opts)

    def all_to_all_single(self, output, tensor, out_splits, in_splits, opts):
        splits = (
            [int(s) for s in in_splits]
            if in_splits is not None and len(in_splits)
            else [tensor.shape[0] // self.n] * self.n
        )
        row = _nb(tensor) // max(1, tensor.shape[0])
        self._note("all_to_all", (sum(splits) - splits[self.me]) * row)
        return self.inner.all_to_all_single(output, tensor, out_splits, in_splits, opts)

    def broadcast(self, tensors, opts):
        self._note("broadcast", sum(map(_nb, tensors)))
        return self.inner.broadcast(tensors, opts)

    def barrier(self, opts):
        self._note("barrier", 0)
        return self.inner.barrier(opts)


class SameOnEveryRank:
    """The data iterator's micro-batches with tokens and labels drawn from one seed for every rank."""

    def __init__(self, inner) -> None:
        self.inner, self.count = inner, 0

    def __next__(self) -> dict:
        batch = dict(next(self.inner))
        generator = torch.Generator().manual_seed(1000 + self.count)
        self.count += 1
        batch["tokens"] = torch.randint(0, 1000, batch["tokens"].shape, generator=generator)
        batch["labels"] = torch.randint(0, 1000, batch["labels"].shape, generator=generator)
        return batch


_ITERATORS: dict[int, SameOnEveryRank] = {}


def symmetric_forward_step(data_iterator, model, return_schedule_plan=False):
    same = _ITERATORS.setdefault(id(data_iterator), SameOnEveryRank(data_iterator))
    return forward_step(same, model, return_schedule_plan)


def count_expert_tokens(model) -> None:
    for chunk in model:
        for module in chunk.modules():
            if type(module).__name__ in ("TorchGroupedMLP", "GroupedMLP", "SequentialMLP", "TEGroupedMLP"):
                module.register_forward_pre_hook(
                    lambda mod, args: EXPERT_TOKENS.append([int(x) for x in args[1].tolist()])
                )


def record_step_of_a_wider_world(out: Path) -> None:
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.dist.device = "cpu"
    cfg.model.expert_model_parallel_size = 4
    cfg.train.train_iters = 1
    cfg.train.global_batch_size = 8
    cfg.logger.log_dir = str(out / "record")
    cfg.emulation.world_size, cfg.emulation.gpus_per_node, cfg.emulation.network = 4, 1, "h100_ib400"
    result = pretrain_module.pretrain(cfg)
    summary = json.loads(Path(result.summary_path).read_text())
    (out / "record.json").write_text(json.dumps(dict(summary["emulation"]["steps"][0], losses=result.losses)))


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    if mode == "record":
        record_step_of_a_wider_world(out)
        return
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.dist.device = "cpu"
    cfg.model.expert_model_parallel_size = 2
    cfg.model.num_layers = 1  # a second layer's routing would read what peers' experts returned: stand-ins here
    cfg.train.train_iters = 1
    cfg.train.global_batch_size = 4
    cfg.logger.log_dir = str(out / mode)
    if mode == "emulated":
        cfg.emulation.world_size = 2
    else:
        dist.Backend.register_backend("recording_gloo", RecordingGloo, extended_api=True, devices=["cpu"])
        dist.init_process_group("recording_gloo")
    build = trainer_module.build_model

    def build_and_watch(*args, **kwargs):
        model = build(*args, **kwargs)
        count_expert_tokens(model)
        return model

    trainer_module.build_model = build_and_watch
    steps: list = []
    record = pretrain_module.Trainer._record

    def record_step(trainer, *args, **kwargs):
        record(trainer, *args, **kwargs)
        if mode == "real":
            names = megatron_group_names()
            steps.append([(kind, names.get(id(group), "world"), nbytes) for kind, group, nbytes in ORDER])
        else:
            steps.append(
                [(kind, group.split("[")[0], nbytes) for group, kind, nbytes in trainer.world.steps[-1]["order"]]
            )

    resume = pretrain_module.Trainer.resume

    def resume_and_forget(trainer):
        resume(trainer)
        ORDER.clear()  # what building and loading issued is not the step's
        if mode == "emulated":
            trainer.world.backend.record.keep_order = True  # the steps' collectives, in issue order

    pretrain_module.Trainer._record = record_step
    pretrain_module.Trainer.resume = resume_and_forget
    result = pretrain_module.pretrain(cfg, symmetric_forward_step)
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    (out / f"{mode}.json").write_text(
        json.dumps(dict(calls=steps[0], expert_tokens=EXPERT_TOKENS, losses=result.losses))
    )


if __name__ == "__main__":
    main()
