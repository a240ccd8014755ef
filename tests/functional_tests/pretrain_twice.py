"""Child program (one process, CPU): two ``pretrain()`` runs in one process.

Prints ``REPORT {json}`` with how many of the first run's parameters and model chunks are still
alive after it returned (weak references taken when the model was built). Arguments: the output
directory, then ``real`` (a world of one) or ``emulated`` (rank 0 of an emulated world of four,
data parallel, with the gradient reduce-scatter and parameter all-gather overlapped).
"""

import json
import os
import sys
import weakref
from pathlib import Path

os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29541")

from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config  # noqa: E402
from megatron.bridge.training import pretrain as pretrain_module  # noqa: E402
from megatron.bridge.training.loop import trainer as trainer_module  # noqa: E402

OUT = Path(sys.argv[1])
EMULATED = sys.argv[2] == "emulated"
built = []
_build_model = trainer_module.build_model


def build_model_and_watch(*args, **kwargs):
    chunks = _build_model(*args, **kwargs)
    built.append([weakref.ref(p) for c in chunks for p in c.parameters()] + [weakref.ref(c) for c in chunks])
    return chunks


trainer_module.build_model = build_model_and_watch  # the name the trainer calls


def tiny(name: str):
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.dist.device = "cpu"
    cfg.train.train_iters = 2
    cfg.logger.log_dir = str(OUT / name)
    if EMULATED:
        cfg.emulation.world_size, cfg.emulation.gpus_per_node = 4, 2
        cfg.optimizer.use_distributed_optimizer = True
        cfg.comm_overlap.overlap_grad_reduce = cfg.comm_overlap.overlap_param_gather = True
    return cfg


report = {}
for run in ("first", "second"):
    result = pretrain_module.pretrain(tiny(run))  # no gc.collect() here: the memory must be free when pretrain returns
    report[run] = {
        "losses": len(result.losses),
        "alive": sum(r() is not None for r in built[-1]),
        "watched": len(built[-1]),
    }
print("REPORT " + json.dumps(report))
