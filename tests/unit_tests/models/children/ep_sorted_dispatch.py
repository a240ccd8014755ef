"""Child program (gloo on CPU): the sorted EP dispatcher against megatron's, at EP = ``WORLD_SIZE``.

argv: RANK PORT [cuda]; ``WORLD_SIZE`` ranks (default 2), all in one expert-parallel group. Builds
the same 2-layer Qwen3-MoE-like model with ``torch_native_dispatcher`` set to ``megatron`` and to
``sorted``, runs megatron's schedules (standard 1F1B, the combined-1F1B EP-overlap schedule, and
that schedule with delayed expert wgrad) and prints one ``REPORT {json}`` line with losses and
gradient differences. On CPU (gloo, fp32, the collective transport, and the NVSHMEM exchange over
an emulation of torch's kernel) the results must be bitwise equal; with ``cuda`` (one GPU per rank,
NCCL, bf16, the NVSHMEM transport where available) this program is the GPU check of the same path.
"""

import contextlib
import os
import sys

import torch
import torch.distributed as dist
from child_exit import finish  # beside this program

RANK, PORT = int(sys.argv[1]), sys.argv[2]
WORLD = int(os.environ.get("WORLD_SIZE", "2"))
ON_GPU = len(sys.argv) > 3 and sys.argv[3] == "cuda"
if ON_GPU:
    torch.cuda.set_device(RANK)
    dist.init_process_group("nccl", rank=RANK, world_size=WORLD, init_method=f"tcp://127.0.0.1:{PORT}")
else:
    from megatron.bridge.training.devices import cpu_compat

    cpu_compat.enable_cpu_compat()
    dist.init_process_group("gloo", rank=RANK, world_size=WORLD, init_method=f"tcp://127.0.0.1:{PORT}")

from megatron.core import parallel_state as ps  # noqa: E402
from megatron.core.pipeline_parallel import get_forward_backward_func  # noqa: E402
from megatron.core.utils import get_attr_wrapped_model  # noqa: E402

from megatron.bridge.models.qwen import Qwen3MoEModelProvider  # noqa: E402
from megatron.bridge.models.torch_native.expert_rows import STEP_PEAK  # noqa: E402
from megatron.bridge.models.torch_native.moe_layer import dispatch_choices  # noqa: E402
from megatron.bridge.models.torch_native.sorted_dispatcher import ExpertParallelSortedDispatcher  # noqa: E402

SEQ, MICRO_BATCHES = (256, 4) if ON_GPU else (16, 3)
HIDDEN = 256 if ON_GPU else 32
# name: (dispatcher, EP overlap, delayed wgrad, NVSHMEM exchange emulated on CPU, rank capacity factor)
VARIANTS = {
    "megatron": ("megatron", False, False, False, None),
    "sorted": ("sorted", False, False, False, None),
    "sorted_overlap": ("sorted", True, False, False, None),
    "sorted_overlap_delay_wgrad": ("sorted", True, True, False, None),
    # a budget of 1.5 x tokens x top-k rows, which this routing stays within: the same results
    "sorted_budget": ("sorted", False, False, False, 1.5),
    "sorted_budget_overlap": ("sorted", True, False, False, 1.5),
    # half a balanced rank's rows (the rules refuse it; set here to force an overflow): finite, stopped
    "sorted_over_budget": ("sorted", False, False, False, 0.5),
}
if not ON_GPU:  # the NVSHMEM exchange's host logic, over torch's kernel emulated with late thread blocks
    VARIANTS["sorted_nvshmem_emulated"] = ("sorted", False, False, True, None)
    VARIANTS["sorted_nvshmem_emulated_overlap"] = ("sorted", True, False, True, None)
    VARIANTS["sorted_nvshmem_emulated_budget"] = ("sorted", False, False, True, 1.5)
    VARIANTS["sorted_nvshmem_emulated_over_budget"] = ("sorted", False, False, True, 0.5)


@contextlib.contextmanager
def nvshmem_exchange_emulated(enabled: bool):
    """The sorted dispatcher on ``SymmetricMemoryExchange`` with ``vdev_emulation`` under it."""
    if not enabled:
        yield
        return
    from vdev_emulation import install  # beside this program

    from megatron.bridge.models.torch_native import sorted_exchange as exchange_module
    from megatron.bridge.models.torch_native import symmetric_exchange

    install(setattr, late_blocks=True)
    made, computed = exchange_module.make_exchange, exchange_module.call_rows

    def counted(*args, **kwargs):  # the per-call rows the dispatcher precomputes in its index function
        PRECOMPUTED_CALL_ROWS[0] += 1
        return computed(*args, **kwargs)

    exchange_module._EXCHANGES.clear()
    exchange_module.make_exchange = lambda group, device, prefer_symmetric: symmetric_exchange.SymmetricMemoryExchange(
        group
    )
    exchange_module.call_rows = counted
    try:
        yield
    finally:
        exchange_module.make_exchange, exchange_module.call_rows = made, computed
        exchange_module._EXCHANGES.clear()


PRECOMPUTED_CALL_ROWS = [0]


def loss_func(out):
    loss = out.float().mean()
    return loss, {"loss": loss.detach()}


def forward_step(it, model, return_schedule_plan=False):
    tokens = next(it)
    pos = torch.arange(SEQ, device=tokens.device).unsqueeze(0)
    mask = torch.triu(torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool, device=tokens.device), diagonal=1)
    if return_schedule_plan:
        plan = get_attr_wrapped_model(model, "build_schedule_plan")(tokens, pos, mask, labels=tokens)
        return plan, loss_func
    return model(tokens, pos, mask, labels=tokens), loss_func


def run(dispatcher: str, overlap: bool, delay: bool, emulated: bool, factor: float | None):
    with nvshmem_exchange_emulated(emulated):
        return _run(dispatcher, overlap, delay, factor, transport="nvshmem" if emulated else None)


def _run(dispatcher: str, overlap: bool, delay: bool, factor: float | None, transport=None):
    ps.initialize_model_parallel(1, 1, expert_model_parallel_size=WORLD)
    STEP_PEAK.reset()  # as the training loop does when it builds a run
    provider = Qwen3MoEModelProvider(
        num_layers=2,
        hidden_size=HIDDEN,
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=8,
        ffn_hidden_size=64,
        moe_ffn_hidden_size=16 * (4 if ON_GPU else 1),
        num_moe_experts=8,
        moe_router_topk=3,
        vocab_size=128,
        seq_length=SEQ,
        make_vocab_size_divisible_by=128,
        layer_spec="torch_native",
        use_cpu_initialization=not ON_GPU,
        params_dtype=torch.bfloat16 if ON_GPU else torch.float32,
        bf16=True,
        expert_model_parallel_size=WORLD,
        moe_token_dispatcher_type="alltoall",
        torch_native_dispatcher=dispatcher,
        torch_native_rank_capacity_factor=factor,
        overlap_moe_expert_parallel_comm=overlap,
        delay_wgrad_compute=delay,
        moe_aux_loss_coeff=0.0,
    )
    provider.finalize()
    if ON_GPU:
        from megatron.core import tensor_parallel

        torch.manual_seed(1234)
        tensor_parallel.model_parallel_cuda_manual_seed(1234)
    else:
        cpu_compat.seed_cpu_model_parallel(1234)
    model = provider.provide()
    if ON_GPU:
        model.cuda()
    sorted_layers = sum(
        isinstance(layer.mlp.token_dispatcher, ExpertParallelSortedDispatcher) for layer in model.decoder.layers
    )
    padded_layers = sum(layer.mlp.experts.padded_rows for layer in model.decoder.layers)
    if transport is not None:  # what the dispatcher precomputes for that transport (its per-call indices)
        for layer in model.decoder.layers:
            layer.mlp.token_dispatcher.transport = transport
    g = torch.Generator().manual_seed(10 + RANK)
    data = [torch.randint(0, 128, (1, SEQ), generator=g).to("cuda" if ON_GPU else "cpu") for _ in range(MICRO_BATCHES)]
    out = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(data),
        model=[model],
        num_microbatches=MICRO_BATCHES,
        seq_length=SEQ,
        micro_batch_size=1,
        forward_only=False,
    )
    losses = [float(o["loss"]) for o in out]
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    left = sum(len(stash) for m in model.modules() for stash in getattr(m, "stashes", {}).values())
    choices = dispatch_choices([model])
    peak = STEP_PEAK.take()  # (most rows a rank was sent, budget, balanced share); None without a budget
    ps.destroy_model_parallel()
    return losses, grads, sorted_layers, left, choices, padded_layers, peak


def max_diff(a, b):
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def rel_diff(a, b):
    return max(float((a[k].float() - b[k].float()).norm() / b[k].float().norm().clamp_min(1e-30)) for k in a)


results = {name: run(*variant) for name, variant in VARIANTS.items()}
reference_losses, reference_grads = results["megatron"][:2]
report = {
    "losses": {name: r[0] for name, r in results.items()},
    "sorted_layers": {name: r[2] for name, r in results.items()},
    "padded_layers": {name: r[5] for name, r in results.items()},
    "grad_diff": {name: max_diff(r[1], reference_grads) for name, r in results.items()},
    "grad_rel_diff": {name: rel_diff(r[1], reference_grads) for name, r in results.items()},
    "finite": {name: all(bool(torch.isfinite(v).all()) for v in r[1].values()) for name, r in results.items()},
    "expert_grad_norm": float(sum(v.norm() ** 2 for k, v in reference_grads.items() if "experts" in k) ** 0.5),
    "choices": [c.to_dict() for c in dict.fromkeys(c for r in results.values() for c in r[4])],
    "deferred_wgrads_left": {name: r[3] for name, r in results.items()},
    "precomputed_call_rows": PRECOMPUTED_CALL_ROWS[0],
    "step_peak": {name: r[6] for name, r in results.items()},
}
finish(report)
