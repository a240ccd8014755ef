"""GPU acceptance runs of ``megatron.bridge.training.pretrain`` (issue 4) on one GPU or more.

Cases (each one a separate ``python3 -m torch.distributed.run`` launch):

* ``ep1``      Qwen3-30B-A3B-width proxy (``--layers`` layers, seq ``--seq``, MBS 1,
               ``--microbatches`` micro-batches), EP=1, one process, NCCL, overlap off;
* ``ep2_off``  the same model with EP=2: two processes over gloo (both may share one GPU; NCCL
               refuses two ranks on one GPU), overlap off;
* ``ep2_on``   as ``ep2_off`` with ``comm_overlap.overlap_moe_expert_parallel_comm=True``
               (megatron-core's combined-1F1B schedule; CUDA_DEVICE_MAX_CONNECTIONS from the
               overlap report).

Every case writes ``<out>/<case>/summary.json`` and ``<out>/<case>/log.txt``; the script then writes
``<out>/acceptance.json`` and ``<out>/acceptance.md`` (losses, steady-state step times over
iterations 3-8, the EP=2 off/on loss agreement). A failing case is retried once with the plain
megatron-core layer spec and without the distributed optimizer (noted in the results), so one
batch of device time yields as much evidence as possible.

Run from the repository root (no ``uv`` needed):

    PYTHONPATH=src python3 scripts/performance/gpu_acceptance_training.py --out runs/gpu_acceptance

Multi-GPU machines: ``--gpus-per-case`` spreads the EP=2 ranks over GPUs (then ``--ep2-backend
nccl`` works too); multi-node launches go through the performance harness instead.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
CASES = ("ep1", "ep2_off", "ep2_on")


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/gpu_acceptance", help="output directory")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma list of {CASES}")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--microbatches", type=int, default=4, help="micro-batches per step per rank")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--layer-spec", default="auto", choices=["auto", "local", "torch_native", "transformer_engine"])
    p.add_argument("--ep2-backend", default="gloo", choices=["gloo", "nccl"])
    p.add_argument("--timeout", type=int, default=540, help="seconds per launch")
    p.add_argument("--no-retry", action="store_true", help="do not retry a failed case")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: orchestration check only")
    p.add_argument("--tiny", action="store_true", help="tiny recipe instead of the 30B-width proxy (checks)")
    # Worker mode (what torch.distributed.run starts on every rank).
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)
    p.add_argument("--ep", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--overlap", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", default="nccl", help=argparse.SUPPRESS)
    p.add_argument("--no-distributed-optimizer", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------
# Worker: one rank of one case.


def build_config(args: argparse.Namespace, world_size: int) -> Any:
    """The Qwen3-30B-A3B recipe cut to a proxy: fewer layers, one GPU-sized layout."""
    from megatron.bridge.recipes.qwen import qwen3_30b_a3b_pretrain_config, qwen3_moe_tiny_pretrain_config

    cfg = qwen3_moe_tiny_pretrain_config() if args.tiny else qwen3_30b_a3b_pretrain_config()
    m = cfg.model
    m.num_layers = args.layers
    m.seq_length = args.seq
    m.tensor_model_parallel_size = 1
    m.pipeline_model_parallel_size = 1
    m.virtual_pipeline_model_parallel_size = None
    m.context_parallel_size = 1
    m.expert_model_parallel_size = args.ep
    m.expert_tensor_parallel_size = 1
    m.sequence_parallel = False
    m.layer_spec = args.layer_spec
    cfg.train.micro_batch_size = 1
    cfg.train.global_batch_size = args.microbatches * world_size  # DP = world size here
    cfg.train.train_iters = args.iters
    cfg.optimizer.lr = args.lr
    cfg.optimizer.min_lr = args.lr / 10
    cfg.scheduler.lr_warmup_iters = 2
    cfg.scheduler.lr_decay_iters = None
    if args.no_distributed_optimizer:
        cfg.optimizer.use_distributed_optimizer = False
        cfg.ddp.use_distributed_optimizer = False
    cfg.comm_overlap.overlap_moe_expert_parallel_comm = args.overlap
    cfg.comm_overlap.delay_wgrad_compute = False
    cfg.dist.device = args.device
    cfg.dist.distributed_backend = "gloo" if args.device == "cpu" else args.backend
    cfg.dist.distributed_timeout_minutes = 5
    cfg.dataset.num_workers = 1
    cfg.logger.log_dir = str(Path(args.out) / args.case)
    cfg.logger.steady_state_window = [3, min(8, args.iters)]
    return cfg


def worker(args: argparse.Namespace) -> int:
    from megatron.bridge.training.pretrain import pretrain

    world = int(os.environ.get("WORLD_SIZE", "1"))
    result = pretrain(build_config(args, world))
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"CASE {args.case} DONE losses={result.losses}", flush=True)
    return 0


# ------------------------------------------------------------------------------------------------
# Driver: launch the cases, collect the summaries.


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def case_args(case: str, args: argparse.Namespace) -> tuple[int, list[str]]:
    """(processes, worker flags) of one case."""
    common = [
        "--out", args.out, "--layers", str(args.layers), "--seq", str(args.seq),
        "--microbatches", str(args.microbatches), "--iters", str(args.iters), "--lr", str(args.lr),
        "--device", args.device, *(["--tiny"] if args.tiny else []),
    ]
    if case == "ep1":
        return 1, common + ["--ep", "1", "--backend", "nccl"]
    if case in ("ep2_off", "ep2_on"):
        flags = common + ["--ep", "2", "--backend", args.ep2_backend]
        return 2, flags + (["--overlap"] if case == "ep2_on" else [])
    raise ValueError(f"unknown case {case!r}; choose from {CASES}")


def launch(case: str, args: argparse.Namespace, layer_spec: str, no_dist_opt: bool) -> dict[str, Any]:
    nproc, flags = case_args(case, args)
    out = Path(args.out) / case
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
        "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
        str(Path(__file__).resolve()), "--worker", "--case", case, "--layer-spec", layer_spec,
        *flags, *(["--no-distributed-optimizer"] if no_dist_opt else []),
    ]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    start = time.time()
    with open(out / "log.txt", "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=args.timeout, cwd=REPO).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    return dict(
        case=case, rc=rc, wall_s=round(time.time() - start, 1), layer_spec=layer_spec,
        distributed_optimizer=not no_dist_opt, command=" ".join(cmd[1:]),
    )


def read_summary(out: Path, case: str) -> Optional[dict[str, Any]]:
    path = out / case / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else None


def analyse(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Pass/fail of the acceptance criteria from the summaries."""
    checks: dict[str, Any] = {}
    for case, r in results.items():
        losses = (r.get("summary") or {}).get("losses") or []
        checks[f"{case}_finite"] = bool(losses) and all(math.isfinite(x) for x in losses)
        checks[f"{case}_decreasing"] = len(losses) > 1 and losses[-1] < losses[0]
    off = (results.get("ep2_off", {}).get("summary") or {}).get("losses")
    on = (results.get("ep2_on", {}).get("summary") or {}).get("losses")
    if off and on and len(off) == len(on):
        diffs = [abs(a - b) for a, b in zip(off, on)]
        checks["ep2_off_on_max_abs_loss_diff"] = max(diffs)
        # bf16 tolerance: the schedules reorder work, bf16 sums may round differently.
        checks["ep2_off_on_agree_bf16"] = max(diffs) <= 0.02 * max(abs(x) for x in off)
    return checks


def write_report(out: Path, results: dict[str, dict[str, Any]], checks: dict[str, Any], args: argparse.Namespace) -> None:
    (out / "acceptance.json").write_text(json.dumps(dict(args=vars(args), results=results, checks=checks), indent=2, default=str))
    lines = [
        "# GPU acceptance: megatron-core training (issue 4)",
        "",
        f"Proxy: Qwen3-30B-A3B width, {args.layers} layers, seq {args.seq}, MBS 1, "
        f"{args.microbatches} micro-batches per rank, {args.iters} iterations, bf16.",
        "",
        "| case | rc | layer spec | dist. opt. | steady mean s (it 3-8) | min / max s | tokens/s | TFLOP/s/GPU | peak GiB | first -> last loss |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case, r in results.items():
        s = r.get("summary") or {}
        losses = s.get("losses") or []

        def f(key: str, fmt: str = "{:.3f}") -> str:
            v = s.get(key)
            return fmt.format(v) if isinstance(v, (int, float)) else "-"

        loss_text = f"{losses[0]:.4f} -> {losses[-1]:.4f}" if losses else "-"
        lines.append(
            f"| {case} | {r['rc']} | {s.get('layer_spec') or r['layer_spec']} | {r['distributed_optimizer']} | "
            f"{f('steady_state_mean_s')} | {f('steady_state_min_s')} / {f('steady_state_max_s')} | "
            f"{f('tokens_per_s', '{:.0f}')} | {f('tflops_per_gpu', '{:.2f}')} | {f('peak_memory_gib', '{:.1f}')} | {loss_text} |"
        )
    lines += ["", "Checks:", ""] + [f"- {k}: {v}" for k, v in checks.items()]
    lines += ["", "Commands:", ""] + [f"- `{r['command']}`" for r in results.values()]
    (out / "acceptance.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def driver(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    for case in [c.strip() for c in args.cases.split(",") if c.strip()]:
        print(f"=== {case} ===", flush=True)
        r = launch(case, args, args.layer_spec, no_dist_opt=False)
        if r["rc"] != 0 and not args.no_retry:
            print(f"{case} failed (rc {r['rc']}); retrying with layer_spec=local, no distributed optimizer", flush=True)
            (out / case / "log.txt").rename(out / case / "log_first_attempt.txt")
            first = r
            r = launch(case, args, "local", no_dist_opt=True)
            r["first_attempt"] = first
        r["summary"] = read_summary(out, case)
        results[case] = r
        tail = (out / case / "log.txt").read_text().splitlines()[-3:]
        print(f"{case}: rc {r['rc']} in {r['wall_s']} s; " + " | ".join(tail), flush=True)
    checks = analyse(results)
    write_report(out, results, checks, args)
    return 0 if all(r["rc"] == 0 for r in results.values()) else 1


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
