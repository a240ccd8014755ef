"""GPU check: does torch's ``symm_mem.all_to_all_vdev`` deliver the right rows under load?

Run with two ranks (one GPU each, or two ranks sharing one GPU under CUDA MPS, see
``ep_exchange_graph.py``)::

    torchrun --nproc-per-node 2 tests/gpu_checks/vdev_offsets.py [--iterations N] [--no-load]

Why: in torch's kernel (``allToAllV`` in ``nvshmem_extension.cu``, torch 2.11) every thread block
reads the source offset of its peer from the split buffer, and block 0, once it has issued its own
reads, overwrites those source offsets with the output offsets. A block that reaches the read
after that pulls its rows from the wrong place in the peer's send buffer. Whether a block is that
late depends on when the GPU schedules it: rarely on an idle GPU, more often while kernels of
another stream occupy it (the EP-overlap schedule, and more so a replayed CUDA graph of it). With a
single block (``TORCH_SYMMMEM_NBLOCKS=1``) block 0 reads every offset before it writes.

Every iteration sends rows that name their source rank, destination and row number, with split
sizes that change per iteration, over a 4 MiB buffer (torch's full 64-block grid); with load, a
matmul stream runs beside it. ``--exchange`` sends the same rows through the product's
``SymmetricMemoryExchange`` (one peer per call, where the two offsets agree). Prints one
``REPORT {json}`` line from rank 0: iterations whose received rows were wrong, per rank.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

parser = argparse.ArgumentParser()
parser.add_argument("--iterations", type=int, default=2000)
parser.add_argument("--no-load", action="store_true", help="no matmul stream beside the exchange")
parser.add_argument("--backend", default="gloo", choices=("nccl", "gloo"))
parser.add_argument(
    "--exchange",
    action="store_true",
    help="send through the product's SymmetricMemoryExchange (one peer per call) instead of one raw call",
)
ARGS = parser.parse_args()

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", RANK)) % torch.cuda.device_count())
dist.init_process_group(ARGS.backend)
GROUP = dist.group.WORLD.group_name
symm_mem.set_backend("NVSHMEM")
symm_mem.enable_symm_mem_for_group(GROUP)

WIDTH = 64  # int32 per row: 256-byte rows
ROWS = (4 << 20) // (WIDTH * 4)  # 4 MiB send buffer


DEVICE = torch.device("cuda", torch.cuda.current_device())


def alloc(*shape, dtype):
    t = symm_mem.empty(*shape, dtype=dtype, device=DEVICE)
    symm_mem.rendezvous(t, GROUP)
    return t


send, recv = alloc(ROWS, WIDTH, dtype=torch.int32), alloc(ROWS, WIDTH, dtype=torch.int32)
in_splits, out_splits_offsets = alloc(WORLD, dtype=torch.int64), alloc(2, WORLD, dtype=torch.int64)


def splits(iteration: int, src: int) -> list[int]:
    """Rows ``src`` sends to each rank in ``iteration`` (every rank can compute every rank's)."""
    g = torch.Generator().manual_seed(iteration * 131 + src)
    per_peer = ROWS // (2 * WORLD)
    return [int(x) for x in torch.randint(1, per_peer, (WORLD,), generator=g)]


def payload(src: int, dst: int, rows: int) -> torch.Tensor:
    row = torch.arange(rows, device=DEVICE, dtype=torch.int32).unsqueeze(1)
    col = torch.arange(WIDTH, device=DEVICE, dtype=torch.int32).unsqueeze(0)
    return (src * 1_000_000 + dst * 100_000 + row * 8 + col % 8).to(torch.int32)


EXCHANGE = None
if ARGS.exchange:
    from megatron.bridge.models.torch_native.symmetric_exchange import SymmetricMemoryExchange
    from megatron.bridge.models.torch_native.token_exchange import Route

    EXCHANGE = SymmetricMemoryExchange(dist.group.WORLD)
load_stream = torch.cuda.Stream()
a = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16)
wrong = 0
for it in range(ARGS.iterations):
    mine = splits(it, RANK)
    offsets = [sum(mine[:d]) for d in range(WORLD)]
    for dst in range(WORLD):
        send[offsets[dst] : offsets[dst] + mine[dst]] = payload(RANK, dst, mine[dst])
    in_splits.copy_(torch.tensor(mine, device=DEVICE))
    if not ARGS.no_load:
        load_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(load_stream):
            for _ in range(2):
                torch.mm(a, a)
    expected = torch.cat([payload(src, RANK, splits(it, src)[RANK]) for src in range(WORLD)])
    if EXCHANGE is None:
        torch.ops.symm_mem.all_to_all_vdev(send, recv, in_splits, out_splits_offsets, GROUP)
        got = recv[: expected.shape[0]]
    else:
        route = Route(
            in_splits.clone(),
            torch.tensor([splits(it, src)[RANK] for src in range(WORLD)], device=DEVICE),
            recv_rows=WORLD * ROWS // 2,
            source_rows=ROWS // 2,
        )
        got = EXCHANGE.exchange([send[: sum(mine)]], route, lambda r: r[: expected.shape[0]].view(torch.int32).clone())
    wrong += int(not torch.equal(got, expected))
    torch.cuda.current_stream().wait_stream(load_stream)
    dist.barrier()

counts = [None] * WORLD
dist.all_gather_object(counts, wrong)
if RANK == 0:
    print(
        "REPORT "
        + json.dumps(
            {
                "iterations": ARGS.iterations,
                "load": not ARGS.no_load,
                "wrong_iterations_per_rank": counts,
                "blocks_env": os.environ.get("TORCH_SYMMMEM_NBLOCKS"),
                "torch": torch.__version__,
                "through": "SymmetricMemoryExchange" if ARGS.exchange else "one all_to_all_vdev call",
            }
        ),
        flush=True,
    )
dist.destroy_process_group()
