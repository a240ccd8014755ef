"""Child program (one process, CPU): each CUDA call the CPU compatibility layer maps, then a tiny
megatron GPTModel forward/backward; prints one ``REPORT {json}`` line. argv: RANK PORT.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

import megatron.bridge.recipes.qwen  # noqa: F401 (imported for the check below)
import megatron.bridge.training.config  # noqa: F401 (imported for the check below)

# Importing training code must not import (let alone activate) the compat layer.
report = {"imported_implicitly": "megatron.bridge.training.devices.cpu_compat" in sys.modules}
from megatron.bridge.training.devices import cpu_compat

report["enabled_before"] = cpu_compat.cpu_compat_enabled()

# As on a machine where Transformer Engine imports: megatron-core has picked TE's CUDA-only kernels.
from megatron.core import optimizer as mcore_optimizer
from megatron.core.optimizer import clip_grads
from megatron.core.transformer.moe import moe_utils


def cuda_only(*args, **kwargs):
    raise RuntimeError("No CUDA GPUs are available (a Transformer Engine kernel)")


moe_utils.te_general_gemm = mcore_optimizer.Adam = clip_grads.l2_norm_impl = cuda_only
mcore_optimizer.USING_PYTORCH_OPTIMIZER = False
cpu_compat.enable_cpu_compat()
cpu_compat.enable_cpu_compat()  # idempotent
report["enabled_after"] = cpu_compat.cpu_compat_enabled()
report["te_kernels_replaced"] = (
    moe_utils.te_general_gemm is None
    and mcore_optimizer.Adam is torch.optim.AdamW
    and mcore_optimizer.USING_PYTORCH_OPTIMIZER
    and clip_grads.l2_norm_impl is not cuda_only
)

# Streams and events.
s = torch.cuda.Stream(device="cuda", priority=-1)
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    report["stream_is_current"] = torch.cuda.current_stream() is s
ev = s.record_event()
ev.synchronize()
torch.cuda.default_stream().wait_event(torch.cuda.Event())
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("x")
torch.cuda.nvtx.range_pop()
# Devices and factories.
t = torch.zeros(3, device="cuda")
u = torch.empty(2, device=torch.cuda.current_device())
report["factory_device"] = [str(t.device), str(u.device), str(t.to("cuda:0").device), str(t.cuda().device)]
t.record_stream(s)
report["type"] = [torch.zeros(1).type(), torch.zeros(1, dtype=torch.bfloat16).type()]
report["type_convert"] = torch.zeros(1).type(torch.float64).dtype == torch.float64

# A tiny Qwen3-MoE GPTModel, forward and backward, on a world-size-1 gloo group.
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ["MASTER_PORT"] = sys.argv[2]
dist.init_process_group("gloo", rank=0, world_size=1)
from megatron.core import parallel_state as ps

from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config

ps.initialize_model_parallel(1, 1, expert_model_parallel_size=1)
cfg = qwen3_moe_tiny_pretrain_config()
cfg.dist.device = "cpu"
cfg.mixed_precision = "fp32"
resolved = cfg.validate(world_size=1)
cpu_compat.seed_cpu_model_parallel(1234)
model = resolved.model.provide()
seq = resolved.model.seq_length
tokens = torch.randint(0, resolved.model.vocab_size, (1, seq))
position_ids = torch.arange(seq).unsqueeze(0)
mask = torch.triu(torch.ones(1, 1, seq, seq, dtype=torch.bool), diagonal=1)
loss = model(tokens, position_ids, mask, labels=tokens).float().mean()
loss.backward()
grads = [p.grad for p in model.parameters() if p.grad is not None]
report["loss"] = float(loss)
report["n_grads"] = len(grads)
report["grads_finite"] = all(bool(torch.isfinite(g).all()) for g in grads)
report["n_params"] = sum(1 for _ in model.parameters())
ps.destroy_model_parallel()
dist.destroy_process_group()
print("REPORT " + json.dumps(report))
