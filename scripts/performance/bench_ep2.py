"""EP=2 as two processes on one GPU (gloo all-to-all on CUDA tensors), overlap off / on / on+delayed wgrad.

Each rank builds the proxy with the torch-native spec and 64 local experts, then times
megatron-core's own ``forward_backward_func`` (``forward_backward_no_pipelining``; with
``overlap_moe_expert_parallel_comm`` it runs the combined-1F1B schedule via
``GPTModel.build_schedule_plan``). No DDP/optimizer: forward+backward only, like the harness.
NCCL refuses two ranks on one GPU, hence gloo; the all-to-alls go through host memory, so these
numbers measure the schedule, not a production interconnect.
"""

from __future__ import annotations

import json
import os
import time
from functools import partial
from typing import Any, Dict, List

import torch
import torch.distributed as dist

from bench_harness import ProxyShape, build_model, flops_per_token, make_batches

CONFIGS = {
    "overlap_off": dict(overlap_moe_expert_parallel_comm=False, delay_wgrad_compute=False),
    "overlap_on": dict(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=False),
    "overlap_on_delay_wgrad": dict(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True),
}


def _loss_func(output_tensor: torch.Tensor):
    loss = output_tensor.float().mean()
    return loss, {"lm loss": loss.detach()}


def _forward_step(data_iterator, model, return_schedule_plan: bool = False):
    batch = next(data_iterator)
    args = (batch["tokens"], batch["position_ids"], None)
    if return_schedule_plan:
        return model.build_schedule_plan(*args, labels=batch["labels"]), _loss_func
    return model(*args, labels=batch["labels"]), _loss_func


def _grad_norm_sq(model) -> float:
    total = 0.0
    for p in model.parameters():
        if p.grad is not None:
            total += float(p.grad.float().pow(2).sum())
    return total


def worker(rank: int, world: int, port: int, shape: ProxyShape, names: List[str], micro_batches: int,
           iters: int, out_path: str) -> None:
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.pipeline_parallel import get_forward_backward_func

    torch.cuda.set_device(0)
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    results: Dict[str, Any] = {}
    for name in names:
        ps.initialize_model_parallel(1, 1, expert_model_parallel_size=world)
        torch.manual_seed(1234)
        tensor_parallel.model_parallel_cuda_manual_seed(1234)
        model, _ = build_model(shape, "torch_native", "cuda", ep=world, **CONFIGS[name])
        model.train()
        batches = make_batches(shape, micro_batches, "cuda", seed=100 + rank)
        fb = get_forward_backward_func()
        step_times, losses, grad_norms = [], [], []
        for it in range(1 + iters):
            model.zero_grad(set_to_none=True)
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fb(forward_step_func=_forward_step, data_iterator=iter(batches), model=[model],
                     num_microbatches=micro_batches, seq_length=shape.seq_length,
                     micro_batch_size=shape.micro_batch_size, forward_only=False)
            torch.cuda.synchronize()
            dist.barrier()
            if it > 0:
                step_times.append(time.perf_counter() - t0)
            losses.append([float(o["lm loss"]) for o in out])
            grad_norms.append(_grad_norm_sq(model))
        tokens = world * micro_batches * shape.micro_batch_size * shape.seq_length
        mean_t = sum(step_times) / len(step_times)
        results[name] = {
            "step_times_s": step_times,
            "tokens_per_s_total": tokens / mean_t,
            "model_tflops_per_gpu": flops_per_token(shape)["forward_backward"] * tokens / mean_t / 1e12,
            "losses_first_iter": losses[0],
            "grad_norm_sq_first_iter": grad_norms[0],
            "peak_memory_gib_this_rank": torch.cuda.max_memory_allocated() / 2**30,
        }
        del model
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        ps.destroy_model_parallel()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def run_ep2(shape: ProxyShape, names: List[str], micro_batches: int, iters: int, out_path: str, port: int = 29733) -> Dict[str, Any]:
    """Spawn the two ranks and return rank 0's results plus equality checks across configs."""
    import torch.multiprocessing as mp

    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    mp.spawn(worker, args=(2, port, shape, names, micro_batches, iters, out_path), nprocs=2, join=True)
    with open(out_path) as f:
        results = json.load(f)
    base = results.get("overlap_off")
    if base:
        for name, r in results.items():
            r["max_abs_loss_diff_vs_off"] = max(abs(a - b) for a, b in zip(r["losses_first_iter"], base["losses_first_iter"]))
            r["grad_norm_sq_rel_diff_vs_off"] = abs(r["grad_norm_sq_first_iter"] - base["grad_norm_sq_first_iter"]) / base["grad_norm_sq_first_iter"]
    return results
