"""Which torch.distributed collectives does gloo run on CUDA tensors? (two ranks on one GPU)

Runs each collective megatron-core's DDP, distributed optimizer and alltoall dispatcher use, in its
own pair of processes, and prints ok / failed / crashed for each: a crash (e.g. SIGSEGV) of one
collective does not hide the others. Usage: ``python3 scripts/performance/probe_gloo_cuda.py``.
"""

from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

OPS = ("all_reduce", "all_to_all_single", "all_gather_into_tensor", "reduce_scatter_tensor",
       "all_reduce_async", "reduce_scatter_tensor_async", "all_gather_into_tensor_async")


def _run(rank: int, op: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    device = torch.device("cuda", 0)
    x = torch.full((1 << 20,), float(rank + 1), device=device)
    base = op.removesuffix("_async")
    async_op = op.endswith("_async")
    if base == "all_reduce":
        work = dist.all_reduce(x, async_op=async_op)
    elif base == "all_to_all_single":
        out = torch.empty_like(x)
        work = dist.all_to_all_single(out, x, async_op=async_op)
    elif base == "all_gather_into_tensor":
        out = torch.empty(2 * x.numel(), device=device)
        work = dist.all_gather_into_tensor(out, x, async_op=async_op)
    else:
        out = torch.empty(x.numel() // 2, device=device)
        work = dist.reduce_scatter_tensor(out, x, async_op=async_op)
    if async_op:
        work.wait()
    torch.cuda.synchronize()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ctx = mp.get_context("spawn")
    results = {}
    for op in OPS:
        port = _free_port()
        procs = [ctx.Process(target=_run, args=(r, op, port)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
        codes = [p.exitcode for p in procs]
        results[op] = "ok" if codes == [0, 0] else f"failed (exit codes {codes})"
        print(f"{op:32s} {results[op]}", flush=True)
    return 0 if all(v == "ok" for v in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
