"""Child program (gloo on CPU, ``WORLD_SIZE`` ranks, default 2): the NVSHMEM exchange, with
torch's ``all_to_all_vdev`` emulated as late thread blocks run it, against the collective exchange.

argv: RANK PORT. Prints one ``REPORT {json}`` line:

* ``one_call_*``: what one ``all_to_all_vdev`` call with rows for every rank delivers when every
  block is late (wrong rows) and when none is (right rows): the hazard the exchange must avoid;
* ``exchanges``: several exchanges in a row (the send slots alternate), with random splits, plain
  and with a packing order: whether the received rows equal ``all_to_all_single``'s bit for bit,
  and how many emulated calls each took.
"""

import os
import sys

import torch
import torch.distributed as dist
from child_exit import finish  # beside this program
from vdev_emulation import EmulatedVdev, install  # beside this program

RANK, PORT = int(sys.argv[1]), sys.argv[2]
WORLD = int(os.environ.get("WORLD_SIZE", "2"))
dist.init_process_group("gloo", rank=RANK, world_size=WORLD, init_method=f"tcp://127.0.0.1:{PORT}")

from megatron.bridge.models.torch_native import symmetric_exchange  # noqa: E402
from megatron.bridge.models.torch_native.token_exchange import CollectiveExchange, Route, copy_columns  # noqa: E402

ROWS, WIDTH = 12, 8  # rows each rank sends in all; float32 columns per row


def split_matrix(seed: int) -> torch.Tensor:
    """``[src, dst]`` rows, each source's row summing to ``ROWS`` (the same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    cuts = torch.sort(torch.randint(0, ROWS + 1, (WORLD, WORLD - 1), generator=g), dim=1).values
    edges = torch.cat([torch.zeros(WORLD, 1, dtype=torch.long), cuts, torch.full((WORLD, 1), ROWS)], dim=1)
    return edges[:, 1:] - edges[:, :-1]


def rows_of(rank: int, seed: int) -> torch.Tensor:
    """Rows that name their rank, row and seed."""
    row = torch.arange(ROWS, dtype=torch.float32).unsqueeze(1)
    return rank * 1000 + seed * 100 + row + torch.arange(WIDTH, dtype=torch.float32) / 100


def one_call(late_blocks: bool) -> bool:
    """Whether one emulated call with rows for every rank delivers this rank's rows right."""
    splits = split_matrix(7)
    send = rows_of(RANK, 7)
    out = torch.zeros(WORLD * ROWS, WIDTH)
    EmulatedVdev(late_blocks)(send, out, splits[RANK].clone(), torch.zeros(2, WORLD, dtype=torch.long), "")
    expected = torch.cat([rows_of(s, 7)[splits[s, :RANK].sum() :][: splits[s, RANK]] for s in range(WORLD)])
    return torch.equal(out[: expected.shape[0]], expected)


def exchange_all(exchange, splits: torch.Tensor, sources, order) -> torch.Tensor:
    route = Route(splits[RANK].clone(), splits[:, RANK].clone(), recv_rows=WORLD * ROWS, source_rows=ROWS)
    total = int(splits[:, RANK].sum())
    columns = [(WIDTH, torch.float32), (1, torch.float32)]  # the data, not the row's padding bytes
    return torch.cat(
        exchange.exchange(
            sources,
            route,
            lambda recv: copy_columns(recv[:total], columns),
            order=order,
            count=torch.tensor([ROWS]) if order is not None else None,
        ),
        1,
    )


report = {"one_call_late_right": one_call(True), "one_call_on_time_right": one_call(False), "exchanges": []}
vdev = install(setattr, late_blocks=True)
symmetric = symmetric_exchange.SymmetricMemoryExchange(dist.group.WORLD)
collective = CollectiveExchange(dist.group.WORLD)
for seed in range(1, 6):
    splits = split_matrix(seed)
    sources = [rows_of(RANK, seed), torch.full((ROWS, 1), float(seed))]
    order = torch.randperm(ROWS, generator=torch.Generator().manual_seed(seed)) if seed % 2 else None
    calls_before = vdev.calls
    got = exchange_all(symmetric, splits, sources, order)
    want = exchange_all(collective, splits, sources, order)
    report["exchanges"].append(
        {
            "equal": torch.equal(got, want),
            "rows": int(want.shape[0]),
            "calls": vdev.calls - calls_before,
            "ordered": order is not None,
        }
    )
finish(report)
