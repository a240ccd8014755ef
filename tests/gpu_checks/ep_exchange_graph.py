"""GPU check: the EP sorted dispatcher's NVSHMEM exchange inside megatron-core's whole-iteration graph.

Run under torchrun with one GPU per process::

    torchrun --nproc-per-node 2 tests/gpu_checks/ep_exchange_graph.py [--proxy] [--steps N]

Builds a Qwen3-MoE model with the torch-native layers, wraps it as the training loop does
(``Float16Module`` + megatron's DDP, built on the capture stream, graph-safe RNG tracker) and runs a
few steps of megatron's schedule without an optimizer, once per variant:

* ``reference``: the dispatcher the product picks for this EP size (one rank: the sorted one-rank
  dispatcher; two or more: megatron-core's alltoall dispatcher), eager;
* ``reference_graph`` (one rank): the same, captured by ``FullCudaGraphWrapper`` and replayed;
* ``exchange`` (two or more ranks): ``ExpertParallelSortedDispatcher`` over NVSHMEM
  (``torch_native_dispatcher=sorted``, ``torch_native_ep_transport=nvshmem``), eager;
* ``exchange_graph``: the same, captured after the warm-up steps and replayed;
* ``exchange_collective`` / ``exchange_collective_overlap``: the sorted dispatcher over
  ``all_to_all_single`` (``torch_native_ep_transport=nccl``: host split sizes, not capturable); with
  ``--backend gloo`` it runs with two ranks on one GPU;
* ``exchange_overlap`` / ``exchange_overlap_graph``: the same under the combined-1F1B EP-overlap
  schedule; with ``onestream`` in the name its communication stages run on the compute stream
  (``disponcomp`` / ``comboncomp``: only the dispatch / only the combine; ``dispfwdcomp`` /
  ``dispbwdcomp``: only the dispatch's forward / backward; ``joinstart`` / ``joinend``: the dispatch
  forward joined with the compute stream before / after it), to bisect a cross-stream race;
  ``delaywgrad`` in the name adds delayed expert weight gradients (``delay_wgrad_compute``);
  ``noreuse`` in the name captures without the allocator option the training loop sets for its
  capture (``graph_capture_record_stream_reuse``, ``training/devices/capture_memory.py``): blocks freed
  during the capture while another captured stream used them then stay reserved until the capture
  ends (the report's ``capture_record_stream_reuse`` says which held).

Any suffix repeats a variant (``exchange_graph_again``: a second run, to see run-to-run spread).

The exchange variants need two ranks: torch's ``all_to_all_vdev`` refuses a one-rank group. On one
GPU, two ranks can share it under CUDA MPS (NVSHMEM refuses several processes on one GPU without it;
NCCL refuses them always, hence ``--backend gloo``, which only the collective exchange uses)::

    export CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d) CUDA_MPS_LOG_DIRECTORY=$(mktemp -d)
    nvidia-cuda-mps-control -d
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 torchrun --nproc-per-node 2 \
        tests/gpu_checks/ep_exchange_graph.py --backend gloo --baseline exchange_collective \
        --variants exchange_collective,exchange,exchange_graph
    echo quit | nvidia-cuda-mps-control

Timings are then those of two processes sharing one GPU; only the comparisons mean something.

Every step draws new tokens; each variant sees the same ones. The report compares per-step losses
and the final gradients (DDP's ``main_grad``) with ``--baseline`` (``reference`` unless given; run
it first) and times the steps
(host time of the forward+backward call, GPU time between events; means over the steps after the
capture). ``--proxy``: the Qwen3-30B-A3B-width proxy at 4 layers, seq 4096, 8 micro-batches. Prints
one ``REPORT {json}`` line from rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback

import stream_checks  # tests/gpu_checks/, beside this program
import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--proxy", action="store_true", help="proxy shapes and timings instead of the small model")
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--warmup", type=int, default=2)
parser.add_argument("--variants", default=None, help="comma-separated; default: all that run at this world size")
parser.add_argument(
    "--baseline",
    default="reference",
    help="the variant the others are compared with (runs first); exchange_collective isolates the "
    "transport: the same dispatcher over all_to_all_single should match the NVSHMEM one bit for bit",
)
parser.add_argument(
    "--backend",
    default="nccl",
    choices=("nccl", "gloo"),
    help="gloo lets several ranks share one GPU (megatron's dispatcher only; NVSHMEM needs a GPU per rank)",
)
parser.add_argument(
    "--sanitize",
    action="store_true",
    help="run under torch's CUDA stream sanitizer (eager variants only: it reports tensor accesses from "
    "two streams with no synchronisation between them, whatever the timing; slow), plus a check for "
    "tensors freed while another stream may still use them (stream_checks.py). Every distinct finding "
    "is printed once and listed with its count in the report; the torch-native layers then run torch "
    "operators only (no Triton, no torch.compile) so that the detectors see every access",
)
parser.add_argument(
    "--torch-ops",
    action="store_true",
    help="torch operators only in the torch-native layers: no Triton kernels, no torch.compile (implied by "
    "--sanitize); tells a race in those kernels from one elsewhere",
)
parser.add_argument(
    "--keep-going",
    action="store_true",
    help="after a variant fails, go on with the next one. Safe only when every rank fails alike: a rank "
    "that fails alone (out of memory, say) leaves the others waiting in a collective until the job's "
    "time limit. By default the program reports what it has and exits 1, so torchrun stops the others",
)
ARGS = parser.parse_args()
ARGS.torch_ops = ARGS.torch_ops or ARGS.sanitize
FINDINGS = stream_checks.Findings()
if ARGS.torch_ops:
    from megatron.bridge.models.torch_native import row_gather

    row_gather.uses_kernel = lambda src: False  # the provider fields below cover the other kernels
if ARGS.sanitize:
    stream_checks.enable(FINDINGS)

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
ONE_RANK_VARIANTS = "reference,reference_graph"
EP_VARIANTS = "reference,exchange,exchange_graph,exchange_overlap,exchange_overlap_graph"
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", RANK)) % torch.cuda.device_count())
dist.init_process_group(ARGS.backend)

from megatron.core import parallel_state as ps  # noqa: E402
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig  # noqa: E402
from megatron.core.pipeline_parallel import get_forward_backward_func  # noqa: E402
from megatron.core.transformer.module import Float16Module  # noqa: E402
from megatron.core.utils import get_attr_wrapped_model  # noqa: E402

from megatron.bridge.models.qwen import Qwen3MoEModelProvider, Qwen3MoEModelProvider30B_A3B  # noqa: E402
from megatron.bridge.training.devices.capture_memory import CaptureMemoryReuse  # noqa: E402
from megatron.bridge.training.devices.cuda_graphs import IterationGraph  # noqa: E402
from megatron.bridge.training.loop.teardown import drop_autograd_graphs, free_memory  # noqa: E402

if ARGS.proxy:
    SEQ, MICRO_BATCHES, VOCAB = 4096, 8, 151936
    SHAPE = dict(num_layers=4)
    PROVIDER = Qwen3MoEModelProvider30B_A3B
else:
    SEQ, MICRO_BATCHES, VOCAB = 256, 4, 512
    SHAPE = dict(
        num_layers=2,
        hidden_size=256,
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=64,
        ffn_hidden_size=512,
        moe_ffn_hidden_size=128,
        num_moe_experts=8,
        moe_router_topk=3,
    )
    PROVIDER = Qwen3MoEModelProvider


class ModelConfig:
    """The three fields IterationGraph reads."""

    cuda_graph_impl = "full_iteration"
    cuda_graph_warmup_steps = ARGS.warmup
    cuda_graph_use_single_mempool = False


_PLAN_INIT = []


def comm_stages_on_compute_stream(variant: str) -> None:
    """Variants with ``onestream`` in the name run megatron's combined-1F1B communication stages
    (dispatch and combine) on the compute stream instead of a stream of their own; ``disponcomp`` /
    ``comboncomp`` move only the dispatch / only the combine, ``dispfwdcomp`` / ``dispbwdcomp`` only
    the dispatch's forward / backward; ``joinstart`` / ``joinend`` keep the streams but order the
    dispatch forward after / before all compute-stream work around it. Tells a cross-stream race from others
    and which stage has it."""
    from megatron.core.models.common import model_chunk_schedule_plan as plans

    if not _PLAN_INIT:
        _PLAN_INIT.append(plans.TransformerLayerSchedulePlan._build_callable_nodes)
    original = _PLAN_INIT[0]
    moved = {
        name
        for name, key in (("moe_dispatch", "disponcomp"), ("moe_combine", "comboncomp"))
        if key in variant or "onestream" in variant
    }

    def build_nodes(self, event, comp_stream, comm_stream, extra_args):
        original(self, event, comp_stream, comm_stream, extra_args)
        for name in moved:
            node = getattr(self, name)
            if hasattr(node, "stream"):
                node.stream = comp_stream
        for direction, key in (("forward", "dispfwdcomp"), ("backward", "dispbwdcomp")):  # one direction
            if key in variant:
                _run_on(self.moe_dispatch, direction, comp_stream)
        for where in ("joinstart", "joinend"):
            if where in variant:
                _joined(self.moe_dispatch, where)

    plans.TransformerLayerSchedulePlan._build_callable_nodes = build_nodes


def _joined(node, where: str) -> None:
    """``joinstart``: the dispatch forward's stream first waits for everything queued on the compute
    stream; ``joinend``: the compute stream waits for the dispatch forward to finish."""
    run = node.forward

    def forward(*args):
        compute = torch.cuda.current_stream()  # the schedule calls the nodes from the compute stream
        if not isinstance(node.stream, torch.cuda.Stream):
            node.stream = node.stream()  # resolved lazily by megatron otherwise
        if where == "joinstart":
            node.stream.wait_stream(compute)
        out = run(*args)
        if where == "joinend":
            compute.wait_stream(node.stream)
        return out

    node.forward = forward


def _run_on(node, direction: str, stream_getter) -> None:
    """Run ``node``'s forward or backward on ``stream_getter()`` instead of its own stream."""
    run = getattr(node, direction)

    def on_stream(*args):
        own = node.stream
        node.stream = stream_getter()
        try:
            return run(*args)
        finally:
            node.stream = own

    setattr(node, direction, on_stream)


def build(variant: str, graph: IterationGraph):
    overlap = "overlap" in variant
    comm_stages_on_compute_stream(variant)
    reference = variant.startswith("reference")
    ps.initialize_model_parallel(1, 1, expert_model_parallel_size=WORLD)
    provider = PROVIDER(
        **SHAPE,
        vocab_size=VOCAB,
        seq_length=SEQ,
        layer_spec="torch_native",
        bf16=True,
        params_dtype=torch.bfloat16,
        expert_model_parallel_size=WORLD,
        moe_token_dispatcher_type="alltoall",
        torch_native_dispatcher="auto" if reference else "sorted",
        torch_native_ep_transport="auto" if reference else ("nccl" if "collective" in variant else "nvshmem"),
        overlap_moe_expert_parallel_comm=overlap,
        delay_wgrad_compute=overlap and "delaywgrad" in variant,
        moe_aux_loss_coeff=0.0,
        **(
            dict(
                torch_native_compile=False,
                torch_native_wgrad_accumulation="unfused",
                torch_native_cross_entropy_backend="torch",
            )
            if ARGS.torch_ops
            else {}
        ),
    )
    provider.finalize()
    torch.manual_seed(1234)
    from megatron.core import tensor_parallel

    tensor_parallel.model_parallel_cuda_manual_seed(1234, use_cudagraphable_rng=graph.enabled, force_reset_rng=True)
    model = provider.provide()
    dispatchers = sorted({type(layer.mlp.token_dispatcher).__name__ for layer in model.decoder.layers})
    model = Float16Module(provider, model.cuda())
    with graph.model_build_stream():
        # As the product's configuration does (ddp.delay_wgrad_compute follows the model's): with it
        # off, DDP hooks the expert weights' AccumulateGrad, which delayed wgrad never reaches.
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            delay_wgrad_compute=provider.delay_wgrad_compute,
        )
        ddp = DistributedDataParallel(config=provider, ddp_config=ddp_config, module=model)
    return ddp, dispatchers


def batches(step: int):
    g = torch.Generator().manual_seed(1000 * step + RANK)
    for _ in range(MICRO_BATCHES):
        tokens = torch.randint(0, VOCAB, (1, SEQ), generator=g).cuda()
        yield {"tokens": tokens, "position_ids": torch.arange(SEQ, device="cuda").unsqueeze(0)}


def loss_func(out):
    loss = out.float().mean()
    return loss, {"loss": loss.detach().clone()}


SCHEDULE_PLANS = [0]  # forward steps that built a combined-1F1B schedule plan


def forward_step(it, model, return_schedule_plan=False):
    batch = next(it)
    SCHEDULE_PLANS[0] += bool(return_schedule_plan)
    tokens, pos = batch["tokens"], batch["position_ids"]
    if return_schedule_plan:
        plan = get_attr_wrapped_model(model, "build_schedule_plan")(tokens, pos, None, labels=tokens)
        return plan, loss_func
    return model(tokens, pos, None, labels=tokens), loss_func


def run(variant: str, ref_grads: dict | None) -> dict:
    SCHEDULE_PLANS[0] = 0
    torch.cuda.reset_peak_memory_stats()
    graph = IterationGraph.from_model_config(ModelConfig)
    graph.enabled = "graph" in variant
    if "noreuse" in variant:
        graph.memory_reuse = CaptureMemoryReuse(False, "off for this variant")
    try:
        model, dispatchers = build(variant, graph)
        fwd_bwd = graph.wrap(get_forward_backward_func(), first_iteration=1)
        losses, host_s, gpu_s = [], [], []
        for step in range(1, ARGS.steps + 1):
            model.zero_grad_buffer()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            start.record()
            out = fwd_bwd(
                forward_step_func=forward_step,
                data_iterator=batches(step),
                model=[model],
                num_microbatches=MICRO_BATCHES,
                seq_length=SEQ,
                micro_batch_size=1,
                forward_only=False,
            )
            host = time.perf_counter() - t0
            end.record()
            torch.cuda.synchronize()
            losses.append([float(o["loss"]) for o in out])
            host_s.append(host)
            gpu_s.append(start.elapsed_time(end) / 1e3)
        memory = peak_memory_gib()
        grads = {n: p.main_grad for n, p in model.module.named_parameters() if hasattr(p, "main_grad")}
        row = grad_diff(grads, ref_grads) if ref_grads is not None else {}
        if variant == ARGS.baseline:
            row["grads"] = {n: g.float().clone() for n, g in grads.items()}
        del grads
    except BaseException:
        graph.release()  # a failed capture must not reach the next variant, nor its allocator option
        raise
    reuse = graph.summary(ARGS.steps)["capture_record_stream_reuse"]
    graph.release()
    drop_autograd_graphs([model])
    del model, fwd_bwd
    ps.destroy_model_parallel()
    free_memory()
    timed = slice(ARGS.warmup + 1, None)  # after the capture step
    return dict(
        row,
        dispatchers=dispatchers,
        losses=losses,
        schedule_plans=SCHEDULE_PLANS[0],
        **memory,
        capture_record_stream_reuse=reuse,
        host_fwd_bwd_s=sum(host_s[timed]) / max(1, len(host_s[timed])),
        gpu_fwd_bwd_s=sum(gpu_s[timed]) / max(1, len(gpu_s[timed])),
        per_step_gpu_s=gpu_s,
    )


def peak_memory_gib() -> dict:
    """This rank's peak GPU memory over the variant (model, steps and any capture), in GiB: what
    tensors held, and what the caching allocator reserved (a capture that cannot reuse freed blocks
    shows here first)."""
    gib = float(1 << 30)
    return dict(
        peak_allocated_gib=round(torch.cuda.max_memory_allocated() / gib, 3),
        peak_reserved_gib=round(torch.cuda.max_memory_reserved() / gib, 3),
    )


def grad_diff(grads: dict, ref: dict) -> dict:
    """Largest relative difference of the final gradients from the reference's, and finiteness."""
    rels = {k: float((grads[k].float() - ref[k]).norm() / ref[k].norm().clamp_min(1e-30)) for k in ref}
    worst = sorted(rels.items(), key=lambda kv: -kv[1] if kv[1] == kv[1] else -float("inf"))[:6]  # NaN first
    return dict(
        max_grad_rel_diff=max(rels.values()),
        worst_grads={k: round(v, 6) for k, v in worst if not v <= 0},
        grads_finite=all(bool(torch.isfinite(v).all()) for v in grads.values()),
    )


SELF_TEST = stream_checks.self_test(FINDINGS) if ARGS.sanitize else None
results, errors = {}, {}
names = (ARGS.variants or (EP_VARIANTS if WORLD > 1 else ONE_RANK_VARIANTS)).split(",")
ref_grads = None
for name in names:
    FINDINGS.label[0] = name
    try:
        results[name] = run(name, ref_grads)
        if name == ARGS.baseline:
            ref_grads = results[name].pop("grads")
    except Exception as exc:  # reported with the variants before it (and after it with --keep-going)
        traceback.print_exc()  # the whole chain, innermost frames included
        errors[name] = "".join(traceback.format_exception_only(exc)).strip()[-2000:]
        if exc.__context__ is not None:
            errors[name] += " <- " + "".join(traceback.format_exception_only(exc.__context__)).strip()[-2000:]
        if not ARGS.keep_going:
            break
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        torch.cuda.synchronize()

report = {
    "world": WORLD,
    "proxy": ARGS.proxy,
    "baseline": ARGS.baseline,
    "errors": errors,
    "variants": {},
    "alloc_conf_env": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    "stream_findings": FINDINGS.report(),
    "stream_self_test": SELF_TEST,
}
ref = results.get(ARGS.baseline)
for name, r in results.items():
    row = {k: v for k, v in r.items() if k != "losses"}
    row["losses_first_step"] = r["losses"][0]
    if ref is not None and name != ARGS.baseline:
        per_step = [max(abs(a - b) for a, b in zip(sa, sb)) for sa, sb in zip(r["losses"], ref["losses"])]
        row["max_loss_diff"], row["loss_diff_per_step"] = max(per_step), per_step
    report["variants"][name] = row
if RANK == 0:
    print("REPORT " + json.dumps(report), flush=True)
if errors and not ARGS.keep_going:
    os._exit(1)  # a peer may be waiting in a collective this rank never joins; torchrun stops it
dist.destroy_process_group()
