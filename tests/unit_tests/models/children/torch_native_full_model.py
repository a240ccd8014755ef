"""Child program (one process, CPU): a small Qwen3-MoE GPT model built with the local layer spec and
with the torch-native one, compared; prints one ``REPORT {json}`` line. argv: RANK PORT.
"""

import os
import sys

import torch
import torch.distributed as dist
from child_exit import finish  # beside this program

from megatron.bridge.training.devices import cpu_compat

cpu_compat.enable_cpu_compat()
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ["MASTER_PORT"] = sys.argv[2]
dist.init_process_group("gloo", rank=0, world_size=1)
from megatron.core import parallel_state as ps

from megatron.bridge.models.qwen import Qwen3MoEModelProvider

ps.initialize_model_parallel(1, 1, expert_model_parallel_size=1)


def build(spec):
    provider = Qwen3MoEModelProvider(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=16,
        ffn_hidden_size=128,
        moe_ffn_hidden_size=32,
        num_moe_experts=8,
        moe_router_topk=2,
        vocab_size=256,
        seq_length=32,
        make_vocab_size_divisible_by=128,
        layer_spec=spec,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        bf16=False,
        moe_token_dispatcher_type="alltoall",
        moe_grouped_gemm=False,
        # plain: megatron-core's unfused loss; native: the torch-native streaming cross-entropy
        cross_entropy_loss_fusion=spec != "local",
    )
    provider.finalize()
    cpu_compat.seed_cpu_model_parallel(1234)
    return provider.provide()


plain, native = build("local"), build("torch_native")
missing = native.load_state_dict(plain.state_dict(), strict=True)
report = {
    "experts_type": type(native.decoder.layers[0].mlp.experts).__name__,
    "attn_type": type(native.decoder.layers[0].self_attention.core_attention).__name__,
    "dispatcher_type": type(native.decoder.layers[0].mlp.token_dispatcher).__name__,
    "model_types": [type(plain).__name__, type(native).__name__],
    "linear_types": sorted({type(m).__name__ for m in native.modules() if "ParallelLinear" in type(m).__name__}),
    "plain_linear_types": sorted({type(m).__name__ for m in plain.modules() if "ParallelLinear" in type(m).__name__}),
}
seq, b = 32, 2
g = torch.Generator().manual_seed(0)
batches = [torch.randint(0, 256, (b, seq), generator=g) for _ in range(6)]
# make one expert idle in the first batch is not controllable via routing; check tokens_per_expert
pos = torch.arange(seq).unsqueeze(0).expand(b, -1)
mask = torch.triu(torch.ones(1, 1, seq, seq, dtype=torch.bool), diagonal=1)


def loss_of(model, tokens):
    return model(tokens, pos, mask, labels=tokens).float().mean()


def grads(model):
    out = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        if name.endswith("experts.weight1") or name.endswith("experts.weight2"):
            fc = "linear_fc1" if name.endswith("1") else "linear_fc2"
            for e in range(p.shape[0]):
                out[name.rsplit(".", 1)[0] + f".local_experts.{e}.{fc}.weight"] = p.grad[e]
        else:
            out[name] = p.grad
    return out


# Forward and gradients on one batch.
lp, ln = loss_of(plain, batches[0]), loss_of(native, batches[0])
lp.backward()
ln.backward()
gp, gn = grads(plain), grads(native)
report["loss_plain"], report["loss_native"] = float(lp), float(ln)
report["grad_keys_equal"] = sorted(gp) == sorted(gn)
report["grad_max_abs_diff"] = max(float((gp[k] - gn[k]).abs().max()) for k in gp)
report["grad_max_abs"] = max(float(v.abs().max()) for v in gp.values())

# A short training run: same optimiser, same data, loss curves side by side.
curves = {}
for label, model in (("plain", plain), ("native", native)):
    model.zero_grad(set_to_none=True)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    curve = []
    for tokens in batches:
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model, tokens)
        loss.backward()
        opt.step()
        curve.append(float(loss))
    curves[label] = curve
report["curves"] = curves
ps.destroy_model_parallel()
finish(report)
