"""Child program (two ranks, gloo on CPU): the torch-native MoE layers under megatron's schedules with
EP=2 (standard, combined-1F1B overlap, delayed wgrad, with and without DDP); prints one
``REPORT {json}`` line per rank. argv: RANK PORT.
"""

import sys

import torch
import torch.distributed as dist
from child_exit import finish  # beside this program

from megatron.bridge.training.devices import cpu_compat

cpu_compat.enable_cpu_compat()
rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}")
from megatron.core import parallel_state as ps
from megatron.core.pipeline_parallel import get_forward_backward_func

from megatron.bridge.models.qwen import Qwen3MoEModelProvider

SEQ, MB = 16, 3
# name: (overlap, delayed wgrad, wrapped in megatron's DDP)
VARIANTS = {
    "off": (False, False, False),
    "overlap": (True, False, False),
    "overlap_delay_wgrad": (True, True, False),
    "ddp_off": (False, False, True),
    "ddp_overlap_delay_wgrad": (True, True, True),
}


def loss_func(out):
    loss = out.float().mean()
    return loss, {"loss": loss.detach()}


def forward_step(it, model, return_schedule_plan=False):
    from megatron.core.utils import get_attr_wrapped_model

    tokens = next(it)
    pos = torch.arange(SEQ).unsqueeze(0)
    mask = torch.triu(torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool), diagonal=1)
    if return_schedule_plan:
        plan = get_attr_wrapped_model(model, "build_schedule_plan")(tokens, pos, mask, labels=tokens)
        return plan, loss_func
    return model(tokens, pos, mask, labels=tokens), loss_func


grads, losses, n_dw = {}, {}, {}
for name, (overlap, delay, ddp) in VARIANTS.items():
    ps.initialize_model_parallel(1, 1, expert_model_parallel_size=2)
    provider = Qwen3MoEModelProvider(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=8,
        ffn_hidden_size=64,
        moe_ffn_hidden_size=16,
        num_moe_experts=4,
        moe_router_topk=2,
        vocab_size=128,
        seq_length=SEQ,
        make_vocab_size_divisible_by=128,
        layer_spec="torch_native",
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        bf16=True,
        expert_model_parallel_size=2,
        moe_token_dispatcher_type="alltoall",
        overlap_moe_expert_parallel_comm=overlap,
        delay_wgrad_compute=delay,
        moe_aux_loss_coeff=0.0,
    )
    provider.finalize()
    cpu_compat.seed_cpu_model_parallel(1234)
    model = provider.provide()
    experts = [layer.mlp.experts for layer in model.decoder.layers]
    calls = [0]
    for e in experts:
        original = e.backward_dw

        def counted(original=original, calls=calls):
            calls[0] += 1
            original()

        e.backward_dw = counted
    run_model = model
    if ddp:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.distributed.finalize_model_grads import finalize_model_grads

        ddp_cfg = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=True, delay_wgrad_compute=delay, bucket_size=None
        )
        run_model = DistributedDataParallel(provider, ddp_cfg, model)
        provider.finalize_model_grads_func = finalize_model_grads
        provider.no_sync_func = run_model.no_sync
        provider.grad_sync_func = None
        run_model.zero_grad_buffer()
    g = torch.Generator().manual_seed(10 + rank)
    data = [torch.randint(0, 128, (1, SEQ), generator=g) for _ in range(MB)]
    out = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(data),
        model=[run_model],
        num_microbatches=MB,
        seq_length=SEQ,
        micro_batch_size=1,
        forward_only=False,
    )
    losses[name] = [float(o["loss"]) for o in out]
    if ddp:  # what the optimizer would read: DDP's (reduced) fp32 main grads
        grads[name] = {k: p.main_grad.clone() for k, p in model.named_parameters()}
    else:
        grads[name] = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    n_dw[name] = calls[0]
    ps.destroy_model_parallel()


def max_diff(a, b):
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    return max(float((a[k] - b[k]).abs().max()) for k in a)


report = {
    "losses": losses,
    "n_grads": {k: len(v) for k, v in grads.items()},
    "backward_dw_calls": n_dw,
    "grad_diff_overlap": max_diff(grads["overlap"], grads["off"]),
    "grad_diff_delay": max_diff(grads["overlap_delay_wgrad"], grads["off"]),
    "grad_diff_ddp_delay": max_diff(grads["ddp_overlap_delay_wgrad"], grads["ddp_off"]),
    "ddp_expert_main_grad_norm": float(
        sum(v.norm() ** 2 for k, v in grads["ddp_off"].items() if "experts" in k) ** 0.5
    ),
    "expert_grad_norm": float(sum(v.norm() ** 2 for k, v in grads["off"].items() if "experts" in k) ** 0.5),
}
finish(report)
