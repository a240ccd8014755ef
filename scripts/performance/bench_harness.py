"""Self-contained forward+backward timing harness for the torch-native vs plain layer specs.

Used by ``benchmark_torch_native.py``; every ``run_*`` function here runs inside its own worker
process (a fresh CUDA context and allocator per measurement) and returns a JSON-able dict.

Model: the Qwen3-30B-A3B width (hidden 2048, 32/4 heads, 128 experts top-8, expert FFN 768,
vocab 151,936) with few layers, built with ``GPTModelProvider.provide()`` after
``initialize_model_parallel`` on a one-rank group, bf16 parameters (router in fp32 as the recipe).
Timing: CUDA events around ``micro_batches`` forward+backward passes of random tokens (no optimizer
step, gradients accumulate as in gradient accumulation), after warm-up passes.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch


@dataclass
class ProxyShape:
    """The benchmark model: Qwen3-30B-A3B width, ``num_layers`` deep."""

    num_layers: int = 4
    seq_length: int = 4096
    micro_batch_size: int = 1
    hidden_size: int = 2048
    num_attention_heads: int = 32
    num_query_groups: int = 4
    kv_channels: int = 128
    moe_ffn_hidden_size: int = 768
    num_moe_experts: int = 128
    moe_router_topk: int = 8
    vocab_size: int = 151936

    @classmethod
    def tiny(cls) -> "ProxyShape":
        """For smoke-testing the harness on CPU."""
        return cls(num_layers=2, seq_length=64, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                   kv_channels=16, moe_ffn_hidden_size=32, num_moe_experts=8, moe_router_topk=2, vocab_size=512)


def flops_per_token(shape: ProxyShape) -> Dict[str, float]:
    """Forward FLOPs per token, MoE-aware (only the top-k experts count), causal attention halved.

    Same convention as ``megatron.bridge.training.flops.flops_per_token``.
    """
    h, a, g, d, s = shape.hidden_size, shape.num_attention_heads, shape.num_query_groups, shape.kv_channels, shape.seq_length
    layers = shape.num_layers
    parts = {
        "attention_projections": layers * (2 * h * a * d + 2 * 2 * h * g * d + 2 * a * d * h),
        "attention_core": layers * 2 * s * a * d,
        "router": layers * 2 * h * shape.num_moe_experts,
        "routed_experts": layers * shape.moe_router_topk * 3 * 2 * h * shape.moe_ffn_hidden_size,
        "logits": 2 * h * shape.vocab_size,
    }
    parts["forward"] = float(sum(parts.values()))
    parts["forward_backward"] = 3.0 * parts["forward"]
    return parts


# ------------------------------------------------------------------------------------ set-up


def init_single_rank(device: str, backend: Optional[str] = None, ep: int = 1) -> None:
    """One-rank process group (NCCL on GPU) plus megatron's parallel state and RNG."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29611")
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend or ("nccl" if device == "cuda" else "gloo"))
    ps.initialize_model_parallel(1, 1, expert_model_parallel_size=ep)
    torch.manual_seed(1234)
    if device == "cuda":
        tensor_parallel.model_parallel_cuda_manual_seed(1234)
    else:
        tensor_parallel.model_parallel_cuda_manual_seed(1234, inference_rng_tracker=True, force_reset_rng=True)


def build_model(shape: ProxyShape, layer_spec: str, device: str, ep: int = 1, **overrides: Any):
    """The proxy ``GPTModel`` via our provider; bf16 params on GPU, fp32 on CPU."""
    from megatron.bridge.models.qwen import Qwen3MoEModelProvider

    on_gpu = device == "cuda"
    kwargs: Dict[str, Any] = dict(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_attention_heads,
        num_query_groups=shape.num_query_groups,
        kv_channels=shape.kv_channels,
        ffn_hidden_size=6144,
        moe_ffn_hidden_size=shape.moe_ffn_hidden_size,
        num_moe_experts=shape.num_moe_experts,
        moe_router_topk=shape.moe_router_topk,
        vocab_size=shape.vocab_size,
        seq_length=shape.seq_length,
        layer_spec=layer_spec,
        expert_model_parallel_size=ep,
        bf16=on_gpu,
        params_dtype=torch.bfloat16 if on_gpu else torch.float32,
        pipeline_dtype=torch.bfloat16 if on_gpu else torch.float32,
        use_cpu_initialization=not on_gpu,
        moe_token_dispatcher_type="alltoall",
    )
    if layer_spec == "local":  # the plain megatron-core model: its own unfused cross-entropy too
        kwargs["cross_entropy_loss_fusion"] = False
    kwargs.update(overrides)
    provider = Qwen3MoEModelProvider(**kwargs)
    provider.finalize()
    model = provider.provide()
    if on_gpu:
        model = model.cuda()
    return model, provider


def make_batches(shape: ProxyShape, n: int, device: str, seed: int = 0) -> List[Dict[str, torch.Tensor]]:
    """Random-token micro-batches (mock data): tokens, position ids, labels."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for _ in range(n):
        tokens = torch.randint(0, shape.vocab_size, (shape.micro_batch_size, shape.seq_length + 1), generator=g)
        pos = torch.arange(shape.seq_length).unsqueeze(0).expand(shape.micro_batch_size, -1)
        out.append({
            "tokens": tokens[:, :-1].contiguous().to(device),
            "labels": tokens[:, 1:].contiguous().to(device),
            "position_ids": pos.contiguous().to(device),
        })
    return out


def causal_mask(shape: ProxyShape, device: str) -> Optional[torch.Tensor]:
    """Explicit causal mask on CPU (megatron builds its default one on CUDA); None on GPU."""
    if device == "cuda":
        return None
    s = shape.seq_length
    return torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)


def fwd_bwd(model, batch: Dict[str, torch.Tensor], mask: Optional[torch.Tensor]) -> torch.Tensor:
    """One micro-batch: per-token losses from the model, mean, backward."""
    losses = model(batch["tokens"], batch["position_ids"], mask, labels=batch["labels"])
    loss = losses.float().mean()
    loss.backward()
    return loss.detach()


# ------------------------------------------------------------------------------------ phases


def run_ceiling(repeats: int = 20, n: int = 8192) -> Dict[str, Any]:
    """bf16 dense matmul ceiling: n^3 on random data, median of ``repeats`` timed products."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    med = statistics.median(times)
    return {"n": n, "repeats": repeats, "median_s": med, "tflops": 2 * n**3 / med / 1e12,
            "min_s": min(times), "max_s": max(times), "device": torch.cuda.get_device_name(),
            "torch": torch.__version__}


def run_grouped_probe() -> Dict[str, Any]:
    """GPU self-check of the grouped GEMM path vs fp32 per-expert matmuls, plus its speed."""
    from megatron.bridge.models.torch_native import grouped_gemm as gg

    torch.manual_seed(0)
    out: Dict[str, Any] = {"backend": None}
    E, h, f = 16, 256, 192
    counts = torch.randint(0, 40, (E,))
    counts[3] = 0
    counts[7] = 1  # unaligned group sizes and an empty expert
    x = torch.randn(int(counts.sum()), h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(E, f, h, device="cuda", dtype=torch.bfloat16) * 0.05).requires_grad_()
    out["backend"] = gg.select_backend(x)
    y = gg.grouped_linear(x, w, counts.cuda())
    dy = torch.randn_like(y)
    gx, gw = torch.autograd.grad(y, (x, w), dy)
    xr, wr = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    yr = gg.reference_grouped_linear(xr, wr, counts.tolist())
    rx, rw = torch.autograd.grad(yr, (xr, wr), dy.float())

    def rel(a, b):
        return float((a.float() - b).norm() / b.norm().clamp_min(1e-12))

    out.update(fwd_rel_err=rel(y, yr), dgrad_rel_err=rel(gx, rx), wgrad_rel_err=rel(gw, rw),
               empty_expert_wgrad_zero=bool(torch.count_nonzero(gw[3]) == 0))
    # Speed of the expert block at the proxy's width: 4096 tokens x top-8 over 128 experts.
    T, E, h, f = 4096 * 8, 128, 2048, 768
    counts = torch.full((E,), T // E, dtype=torch.int64)
    x = torch.randn(T, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w1 = (torch.randn(E, 2 * f, h, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    w2 = (torch.randn(E, h, f, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    cd = counts.cuda()

    def step():
        a = gg.grouped_linear(x, w1, cd)
        g_, l_ = a.chunk(2, dim=-1)
        o = gg.grouped_linear(torch.nn.functional.silu(g_) * l_, w2, cd)
        o.backward(torch.ones_like(o))

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / 10
    out["experts_fwd_bwd_tflops"] = 3 * 3 * 2 * T * h * f / dt / 1e12
    return out


def run_timing(shape: ProxyShape, layer_spec: str, device: str, warmup: int, micro_batches: int,
               profile: bool = False, trace_path: Optional[str] = None, **overrides: Any) -> Dict[str, Any]:
    """Forward+backward throughput of one spec; optionally a torch.profiler top-kernel table."""
    init_single_rank(device)
    t_build = time.perf_counter()
    model, provider = build_model(shape, layer_spec, device, **overrides)
    build_s = time.perf_counter() - t_build
    model.train()
    mask = causal_mask(shape, device)
    batches = make_batches(shape, max(micro_batches, 1), device)
    for i in range(warmup):
        fwd_bwd(model, batches[i % len(batches)], mask)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    # Losses stay on the device until the clock stops: a host sync per micro-batch would idle the GPU.
    losses = [fwd_bwd(model, b, mask) for b in batches[:micro_batches]]
    if device == "cuda":
        end.record()
        end.synchronize()
        elapsed = start.elapsed_time(end) / 1e3
    else:
        elapsed = time.perf_counter() - t0
    losses = [float(x) for x in losses]
    tokens = micro_batches * shape.micro_batch_size * shape.seq_length
    fl = flops_per_token(shape)
    result: Dict[str, Any] = {
        "layer_spec": layer_spec,
        "overrides": {k: str(v) for k, v in overrides.items()},
        "micro_batches": micro_batches,
        "tokens": tokens,
        "elapsed_s": elapsed,
        "tokens_per_s": tokens / elapsed,
        "model_tflops": fl["forward_backward"] * tokens / elapsed / 1e12,
        "flops_per_token_fwd_bwd": fl["forward_backward"],
        "losses": losses,
        "build_s": build_s,
        "experts_module": type(model.decoder.layers[0].mlp.experts).__name__,
        "dispatcher_module": type(getattr(model.decoder.layers[0].mlp, "token_dispatcher", None)).__name__,
        "core_attention_module": type(model.decoder.layers[0].self_attention.core_attention).__name__,
        "model_class": type(model).__name__,
        "loss": provider.describe_loss(device),
    }
    if device == "cuda":
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    if profile and device == "cuda":
        result["profile_table"] = profile_top_kernels(model, batches[:2], mask)
        if trace_path:
            result["trace"] = export_trace(model, batches[0], mask, trace_path)
    return result


def export_trace(model, batch, mask, path: str) -> Dict[str, Any]:
    """Chrome trace (gzipped, CPU ops with Python stacks and GPU kernels) of one micro-batch, plus
    the GPU's busy share of the wall time (union of kernel intervals) for offline gap analysis."""
    import gzip
    import shutil

    from torch.profiler import ProfilerActivity, profile

    from megatron.bridge.perf.overlap_analysis import total

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        fwd_bwd(model, batch, mask)
        torch.cuda.synchronize()
    raw = path[:-3] if path.endswith(".gz") else path
    prof.export_chrome_trace(raw)
    kernels = []
    with open(raw) as f:
        for ev in json.load(f).get("traceEvents", []):
            if ev.get("cat") == "kernel" and "dur" in ev:
                kernels.append((float(ev["ts"]), float(ev["ts"]) + float(ev["dur"])))
    busy = total(kernels)
    span = (max(hi for _, hi in kernels) - min(lo for lo, _ in kernels)) if kernels else 0.0
    with open(raw, "rb") as src, gzip.open(raw + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(raw)
    return {"path": raw + ".gz", "kernels": len(kernels), "gpu_busy_ms": busy / 1e3,
            "kernel_span_ms": span / 1e3, "busy_share": busy / span if span else None}


def profile_top_kernels(model, batches, mask, rows: int = 30) -> str:
    """torch.profiler over a few micro-batches: kernels sorted by total GPU time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for b in batches:
            fwd_bwd(model, b, mask)
        torch.cuda.synchronize()
    kernels = []
    total = 0.0
    for e in prof.key_averages():
        # Kernels only: CPU ops that launch a kernel themselves (autograd Functions, Triton
        # wrappers) also carry device time, and counting them would count that kernel twice.
        if e.device_type != DeviceType.CUDA or e.key.startswith("ProfilerStep"):
            continue
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = getattr(e, "self_cuda_time_total", 0.0)
        if t and t > 0:
            kernels.append((t, e.count, e.key))
            total += t
    kernels.sort(reverse=True)
    lines = [f"GPU kernel time over {len(batches)} micro-batches: {total / 1e3:.1f} ms", "",
             "| share | ms | calls | kernel |", "| ---: | ---: | ---: | --- |"]
    for t, n, name in kernels[:rows]:
        lines.append(f"| {100 * t / total:5.1f}% | {t / 1e3:8.2f} | {n} | {name[:160].replace('|', '/')} |")
    return "\n".join(lines)


def run_equivalence(shape: ProxyShape, device: str) -> Dict[str, Any]:
    """Same weights, same batch: loss and gradients of torch-native vs plain spec (bf16 on GPU)."""
    init_single_rank(device)
    plain, _ = build_model(shape, "local", device)
    native, _ = build_model(shape, "torch_native", device)
    native.load_state_dict(plain.state_dict(), strict=True)
    batch = make_batches(shape, 1, device, seed=7)[0]
    mask = causal_mask(shape, device)
    lp = float(fwd_bwd(plain, batch, mask))
    ln = float(fwd_bwd(native, batch, mask))
    worst, worst_name, total_num, total_den = 0.0, "", 0.0, 0.0
    plain_params = dict(plain.named_parameters())
    for name, p in native.named_parameters():
        if p.grad is None:
            continue
        if name.endswith("experts.weight1") or name.endswith("experts.weight2"):
            fc = "linear_fc1" if name.endswith("1") else "linear_fc2"
            base = name.rsplit(".", 1)[0]
            ref = torch.stack([plain_params[f"{base}.local_experts.{e}.{fc}.weight"].grad for e in range(p.shape[0])])
        else:
            ref = plain_params[name].grad
        num = float((p.grad.float() - ref.float()).norm())
        den = float(ref.float().norm())
        total_num += num**2
        total_den += den**2
        if den > 0 and num / den > worst:
            worst, worst_name = num / den, name
    return {"loss_plain": lp, "loss_native": ln, "loss_rel_diff": abs(lp - ln) / abs(lp),
            "grad_rel_diff_global": (total_num / max(total_den, 1e-30)) ** 0.5,
            "grad_rel_diff_worst_param": worst, "grad_worst_param": worst_name}
