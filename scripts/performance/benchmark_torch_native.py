"""Torch-native vs plain (local) layer spec on one GPU: ceiling, throughput, MFU, memory, EP=2.

One run, in this order (each phase in its own worker process; results land in ``--out`` after
every phase so a crash or timeout keeps what was measured):

1. ``ceiling``: bf16 dense matmul 8192^3 on random data, median of 20 timed products.
2. ``probe``: GPU self-check of the grouped GEMM (vs fp32 per-expert matmuls; empty expert;
   unaligned group sizes) and the speed of the SwiGLU expert block alone.
3. ``plain`` / ``native``: the Qwen3-30B-A3B-width proxy (4 layers, seq 4096, MBS 1, 8 micro-batches,
   random tokens), forward+backward, with megatron-core's local spec and the torch-native spec:
   tokens/s, model TFLOP/s (MoE-aware: top-k experts only), MFU vs the measured ceiling, peak memory.
   ``native`` also records a torch.profiler top-kernel table.
4. ``native_unfused_ce`` / ``native_ce_fusion``: the torch-native spec with megatron-core's unfused
   fp32 cross-entropy / its TorchScript fused one instead of the torch-native streaming loss.
   ``native_megatron_dispatch``: the torch-native spec with megatron's alltoall dispatcher instead of
   the sync-free sorted permutation (A/B against ``torch_native_dispatcher=megatron``).
5. ``equivalence``: same weights and batch, bf16 loss and gradient differences native vs plain.
6. ``ep2``: EP=2 as two processes on the one GPU (gloo), overlap off / on / on + delayed wgrad.

``--mode pretrain`` instead runs ``megatron.bridge.training.pretrain.pretrain`` once per spec
(subprocess each, mock data, full training step incl. optimizer) and reads its ``summary.json``.

Example (GPU machine)::

    python scripts/performance/benchmark_torch_native.py --out /tmp/bench
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

ALL_PHASES = ("ceiling", "probe", "plain", "native", "native_unfused_ce", "native_ce_fusion",
              "native_megatron_dispatch", "equivalence", "ep2")


def _parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench_torch_native_out")
    p.add_argument("--mode", choices=("harness", "pretrain"), default="harness")
    p.add_argument("--phases", default=",".join(ALL_PHASES))
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--plain-micro-batches", type=int, default=2, help="the plain spec is slow: fewer timed")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--ep2-micro-batches", type=int, default=8)
    p.add_argument("--ep2-iters", type=int, default=2)
    p.add_argument("--ep2-configs", default="overlap_off,overlap_on,overlap_on_delay_wgrad")
    p.add_argument("--phase-timeout", type=int, default=240)
    p.add_argument("--scratch", default=None, help="worker scratch dir (default: a temp dir)")
    p.add_argument("--equivalence-layers", type=int, default=2)
    p.add_argument("--equivalence-seq", type=int, default=2048)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: smoke test only")
    p.add_argument("--trace", action="store_true",
                   help="native phase: also write a gzipped chrome trace of one micro-batch to --out")
    p.add_argument("--tiny", action="store_true", help="tiny model (smoke test)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-json", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _shape(args):
    from bench_harness import ProxyShape

    shape = ProxyShape.tiny() if args.tiny else ProxyShape(num_layers=args.layers, seq_length=args.seq)
    if not args.tiny:
        shape.num_layers, shape.seq_length = args.layers, args.seq
    return shape


def _worker(args) -> Dict[str, Any]:
    """Runs one phase in this (fresh) process."""
    if args.device == "cpu":
        from megatron.bridge.training.cpu_compat import enable_cpu_compat

        enable_cpu_compat()
    import bench_harness as bh

    shape = _shape(args)
    name = args.worker
    if name == "ceiling":
        return bh.run_ceiling()
    if name == "probe":
        return bh.run_grouped_probe()
    if name == "plain":
        return bh.run_timing(shape, "local", args.device, warmup=1, micro_batches=args.plain_micro_batches)
    if name == "native":
        trace = str(Path(args.out) / "native_trace.json.gz") if args.trace else None
        return bh.run_timing(shape, "torch_native", args.device, warmup=args.warmup,
                             micro_batches=args.micro_batches, profile=args.device == "cuda", trace_path=trace)
    if name == "native_unfused_ce":  # A/B: megatron-core's unfused fp32 cross-entropy
        return bh.run_timing(shape, "torch_native", args.device, warmup=args.warmup,
                             micro_batches=args.micro_batches, cross_entropy_loss_fusion=False)
    if name == "native_ce_fusion":
        return bh.run_timing(shape, "torch_native", args.device, warmup=args.warmup, micro_batches=args.micro_batches,
                             cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="native")
    if name == "native_megatron_dispatch":  # A/B: megatron's alltoall dispatcher instead of the sorted one
        return bh.run_timing(shape, "torch_native", args.device, warmup=args.warmup,
                             micro_batches=args.micro_batches, torch_native_dispatcher="megatron")
    if name == "equivalence":
        if not args.tiny:
            shape.num_layers, shape.seq_length = args.equivalence_layers, args.equivalence_seq
        return {"num_layers": shape.num_layers, "seq_length": shape.seq_length, **bh.run_equivalence(shape, args.device)}
    if name == "ep2":
        from bench_ep2 import run_ep2

        return run_ep2(shape, args.ep2_configs.split(","), args.ep2_micro_batches, args.ep2_iters,
                       out_path=args.worker_json + ".ep2")
    raise ValueError(f"unknown phase {name}")


def _run_phase(args, phase: str, out: Path) -> Dict[str, Any]:
    scratch = Path(args.scratch or (Path(tempfile.gettempdir()) / "bench_torch_native"))
    scratch.mkdir(parents=True, exist_ok=True)
    tmp = scratch / f"{phase}.json"
    tmp.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", phase, "--worker-json", str(tmp),
           "--device", args.device, "--layers", str(args.layers), "--seq", str(args.seq),
           "--micro-batches", str(args.micro_batches), "--plain-micro-batches", str(args.plain_micro_batches),
           "--warmup", str(args.warmup), "--ep2-micro-batches", str(args.ep2_micro_batches),
           "--ep2-iters", str(args.ep2_iters), "--ep2-configs", args.ep2_configs,
           "--equivalence-layers", str(args.equivalence_layers), "--equivalence-seq", str(args.equivalence_seq)]
    if args.tiny:
        cmd.append("--tiny")
    if args.trace:
        cmd += ["--trace", "--out", str(out)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.phase_timeout)
    except subprocess.TimeoutExpired as exc:
        return {"error": f"timeout after {args.phase_timeout}s", "stderr_tail": str(exc.stderr)[-2000:]}
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not tmp.exists():
        return {"error": f"rc={proc.returncode}", "stderr_tail": proc.stderr[-4000:], "wall_s": wall}
    result = json.loads(tmp.read_text())
    result["wall_s"] = wall
    return result


def _summarise(results: Dict[str, Any], shape, args) -> str:
    """The markdown table the note quotes."""
    ceiling = results.get("ceiling", {}).get("tflops")
    lines = [f"# torch-native vs plain spec, one GPU ({results.get('ceiling', {}).get('device', '?')})", "",
             f"Proxy: Qwen3-30B-A3B width, {shape.num_layers} layers, seq {shape.seq_length}, MBS 1, "
             f"forward+backward of micro-batches (no optimizer step), bf16 params, router fp32.", ""]
    if ceiling:
        lines.append(f"Measured bf16 matmul ceiling (8192^3, median of 20): **{ceiling:.0f} TFLOP/s**")
        lines.append("")
    lines += ["| run | micro-batches timed | tokens/s | model TFLOP/s | MFU | peak mem GiB |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for key in ("plain", "native", "native_unfused_ce", "native_ce_fusion", "native_megatron_dispatch"):
        r = results.get(key)
        if not r or "error" in r:
            if r:
                lines.append(f"| {key} | error: {r['error']} | | | | |")
            continue
        mfu = f"{100 * r['model_tflops'] / ceiling:.1f}%" if ceiling else "n/a"
        lines.append(f"| {key} ({r['layer_spec']}) | {r['micro_batches']} | {r['tokens_per_s']:,.0f} | "
                     f"{r['model_tflops']:.1f} | {mfu} | {r.get('peak_memory_gib', float('nan')):.1f} |")
    p, n = results.get("plain", {}), results.get("native", {})
    if "tokens_per_s" in p and "tokens_per_s" in n:
        lines += ["", f"Speed-up torch-native / plain: **{n['tokens_per_s'] / p['tokens_per_s']:.1f}x**"]
    ep2 = results.get("ep2")
    if ep2 and "error" not in ep2:
        lines += ["", "EP=2, two processes on the one GPU (gloo all-to-all through host memory):", "",
                  "| config | step s (mean) | tokens/s (both ranks) | model TFLOP/s per GPU | max loss diff vs off | grad-norm² rel diff vs off |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for name, r in ep2.items():
            if not isinstance(r, dict) or "step_times_s" not in r:
                continue
            mean = sum(r["step_times_s"]) / len(r["step_times_s"])
            lines.append(f"| {name} | {mean:.2f} | {r['tokens_per_s_total']:,.0f} | {r['model_tflops_per_gpu']:.1f} | "
                         f"{r.get('max_abs_loss_diff_vs_off', float('nan')):.2e} | {r.get('grad_norm_sq_rel_diff_vs_off', float('nan')):.2e} |")
    pt = results.get("pretrain_native")
    if pt:
        if "error" in pt:
            lines += ["", f"pretrain() with the torch-native spec: error {pt['error']}"]
        else:
            keys = ("tokens_per_s", "tflops_per_gpu", "peak_memory_gib", "step_time_mean_s")
            shown = {k: pt[k] for k in keys if k in pt}
            lines += ["", f"pretrain() (real loop: DDP, optimizer) with the torch-native spec: {json.dumps(shown, default=str)}"]
    eq = results.get("equivalence")
    if eq and "error" not in eq:
        lines += ["", f"bf16 equivalence ({eq.get('num_layers')} layers, seq {eq.get('seq_length')}; same weights and batch): loss rel diff {eq['loss_rel_diff']:.2e}, "
                  f"global grad rel diff {eq['grad_rel_diff_global']:.2e}, worst parameter "
                  f"{eq['grad_rel_diff_worst_param']:.2e} ({eq['grad_worst_param']})"]
    for key in ("native", "native_ce_fusion"):
        table = results.get(key, {}).get("profile_table")
        if table:
            lines += ["", f"## Top GPU kernels: {key}", "", table]
    return "\n".join(lines) + "\n"


def run_harness(args) -> Dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shape = _shape(args)
    results: Dict[str, Any] = {"command": " ".join(sys.argv), "shape": asdict(shape), "mode": "harness"}
    phases = [p for p in args.phases.split(",") if p]
    if args.device == "cpu":
        phases = [p for p in phases if p not in ("ceiling", "probe", "ep2", "native_unfused_ce", "native_ce_fusion",
                                                 "native_megatron_dispatch")]
    for phase in phases:
        t0 = time.perf_counter()
        if phase == "pretrain_native":  # the real training loop, optimizer included
            scratch = Path(args.scratch or (Path(tempfile.gettempdir()) / "bench_torch_native"))
            results[phase] = run_pretrain_one(args, "torch_native", 6, scratch / "pretrain_native")
        else:
            results[phase] = _run_phase(args, phase, out)
        status = results[phase].get("error", "ok")
        print(f"[bench] {phase}: {status} ({time.perf_counter() - t0:.0f}s)", flush=True)
        if status != "ok":
            print(results[phase].get("stderr_tail", "")[-3000:], flush=True)
        (out / "torch_native_results.json").write_text(json.dumps(results, indent=2, default=str))
        (out / "torch_native_results.md").write_text(_summarise(results, shape, args))
    print((out / "torch_native_results.md").read_text(), flush=True)
    return results


# ------------------------------------------------------------------------------ pretrain mode

PRETRAIN_CHILD = r"""
import json, sys
from megatron.bridge.recipes import qwen
from megatron.bridge.training.pretrain import pretrain
spec, log_dir, layers, seq, mbs, gbs, iters, recipe, device = sys.argv[1:10]
cfg = getattr(qwen, recipe)()
m = cfg.model
if recipe == "qwen3_30b_a3b_pretrain_config":
    m.num_layers, m.seq_length = int(layers), int(seq)
m.layer_spec = spec
if device == "cpu":
    cfg.dist.device = "cpu"
    cfg.mixed_precision = "fp32"
m.tensor_model_parallel_size = m.pipeline_model_parallel_size = m.expert_model_parallel_size = 1
m.context_parallel_size = 1
m.virtual_pipeline_model_parallel_size = None
if hasattr(m, "expert_tensor_parallel_size"):
    m.expert_tensor_parallel_size = 1
m.moe_token_dispatcher_type = "alltoall"
cfg.comm_overlap.overlap_moe_expert_parallel_comm = False
cfg.comm_overlap.delay_wgrad_compute = False
cfg.train.micro_batch_size, cfg.train.global_batch_size, cfg.train.train_iters = int(mbs), int(gbs), int(iters)
# a few-step benchmark: the recipe's 500-step warm-up would exceed the run (megatron asserts on it)
cfg.scheduler.lr_warmup_iters = 0
cfg.scheduler.lr_decay_iters = None
cfg.dataset.data_paths = None
cfg.checkpoint.save = None
cfg.logger.log_dir = log_dir
if "--validate-only" in sys.argv:
    r = cfg.validate(world_size=1)
    print("VALID", r.model.num_layers, r.model.seq_length, r.model.layer_spec, r.train.train_iters, r.scheduler.lr_warmup_iters)
    sys.exit(0)
pretrain(cfg)
"""


def run_pretrain_one(args, spec: str, iters: int, log_dir: Path) -> Dict[str, Any]:
    """``pretrain(cfg)`` in a subprocess for one spec; its ``summary.json`` (or the error)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    recipe = "qwen3_moe_tiny_pretrain_config" if args.tiny else "qwen3_30b_a3b_pretrain_config"
    cmd = [sys.executable, "-c", PRETRAIN_CHILD, spec, str(log_dir), str(args.layers), str(args.seq), "1",
           str(args.micro_batches), str(iters), recipe, args.device]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.phase_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {args.phase_timeout}s"}
    summary = log_dir / "summary.json"
    if summary.exists():
        return json.loads(summary.read_text())
    return {"error": f"rc={proc.returncode}", "stderr_tail": proc.stderr[-3000:], "stdout_tail": proc.stdout[-2000:]}


def run_pretrain(args) -> Dict[str, Any]:
    """Final numbers through the real training loop: one subprocess per spec, read summary.json."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: Dict[str, Any] = {"command": " ".join(sys.argv), "mode": "pretrain"}
    iters = 8
    for spec in ("local", "torch_native"):
        log_dir = out / f"pretrain_{spec}"
        results[spec] = run_pretrain_one(args, spec, iters if spec == "torch_native" else 3, log_dir)
        print(f"[bench] pretrain {spec}: {results[spec].get('error', 'ok')}", flush=True)
        (out / "torch_native_pretrain.json").write_text(json.dumps(results, indent=2, default=str))
    return results


def main(argv=None) -> int:
    args = _parse(argv)
    if args.worker:
        result = _worker(args)
        Path(args.worker_json).write_text(json.dumps(result, default=str))
        return 0
    if args.mode == "pretrain":
        run_pretrain(args)
    else:
        run_harness(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
