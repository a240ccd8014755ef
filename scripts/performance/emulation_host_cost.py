"""Host cost of one emulated collective, per kind, as megatron-core issues them in an EP=16 step.

The emulated world's own host time is part of every emulated step (``emulation_host_s`` in a run's
record): this prints what one call of each kind costs the host, through ``torch.distributed``'s own
functions, so a change to the backend can be timed on its own. Shapes are one micro-batch of the
Qwen3-30B-A3B layer at seq 4096 (a dispatch of 32768 token rows of hidden 2048, uneven split sizes).

    uv run python scripts/performance/emulation_host_cost.py --calls 2000 [--network free] [--json FILE] [--profile 25]

``--device`` picks where the tensors live (``auto``: the first GPU where one is visible, else the
CPU). The JSON names the command, the GPU it used (``no GPU`` on the CPU), the host
(``host_facts``) and the commit of the code measured (``--commit``, for an export of another commit
on ``PYTHONPATH``; else this checkout's ``HEAD``).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import pstats
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from megatron.bridge.emulation.backend import start_world, stop_world
from megatron.bridge.emulation.network import PRESETS, network_model
from megatron.bridge.perf.benchmarks.benchmark_jobs import device_name, git_commit, host_facts, portable_command

REPO = Path(__file__).resolve().parents[2]

HIDDEN, ROWS, EP = 2048, 32768, 16


def _uneven_splits(rows: int, n: int) -> list[int]:
    """Split sizes that differ from peer to peer (as routed token counts do) and add up to ``rows``."""
    base = [rows // n + (7 * j % 5) - 2 for j in range(n)]
    base[-1] += rows - sum(base)
    return base


def cases(device: torch.device) -> dict[str, Callable[[], object]]:
    """One callable per collective kind, each making the call megatron-core makes."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tokens = torch.randn(ROWS, HIDDEN, device=device, dtype=dtype)
    received = torch.empty_like(tokens)
    splits = _uneven_splits(ROWS, EP)
    counts = torch.ones(EP * 8, device=device, dtype=torch.long)
    counts_out = torch.empty_like(counts)
    grads = torch.randn(8 * 2**20, device=device, dtype=torch.float32)
    shard = torch.empty(grads.numel() // EP, device=device, dtype=torch.float32)
    scalar = torch.ones(1, device=device)

    return {
        "all_to_all_single (even, counts)": lambda: dist.all_to_all_single(counts_out, counts),
        "all_to_all_single (uneven, tokens)": lambda: dist.all_to_all_single(received, tokens, splits, splits[::-1]),
        "reduce_scatter_tensor (async)": lambda: dist.reduce_scatter_tensor(shard, grads, async_op=True).wait(),
        "all_gather_into_tensor (in place, async)": lambda: dist.all_gather_into_tensor(
            grads, grads.narrow(0, 0, shard.numel()), async_op=True
        ).wait(),
        "all_reduce (scalar)": lambda: dist.all_reduce(scalar),
    }


BURST = 50
"""Calls issued between two synchronisations: few enough kernels that the GPU's launch queue never
fills, so the host is never held back by the GPU and only its own time is counted."""


def _bursts(
    call: Callable[[], object], calls: int, device: torch.device, timed: Callable[[], AbstractContextManager[None]]
) -> None:
    """``calls`` calls in bursts of :data:`BURST`, each burst inside ``timed`` (a context), the GPU
    synchronised between bursts, outside it."""
    done = 0
    while done < calls:
        count = min(BURST, calls - done)
        if device.type == "cuda":
            torch.cuda.synchronize()
        with timed():
            for _ in range(count):
                call()
        done += count
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_calls(call: Callable[[], object], calls: int, device: torch.device) -> float:
    """Host seconds per call, the GPU never behind by more than a burst."""
    _bursts(call, 20, device, contextlib.nullcontext)
    spent = [0.0]

    @contextlib.contextmanager
    def timed() -> Iterator[None]:
        start = time.perf_counter()
        yield
        spent[0] += time.perf_counter() - start

    _bursts(call, calls, device, timed)
    return spent[0] / calls


def profile_calls(call: Callable[[], object], calls: int, device: torch.device, top: int) -> str:
    """Where the host time of ``calls`` calls goes: the ``top`` functions by own time (cProfile, C
    functions included; its own overhead inflates the Python share)."""
    _bursts(call, 20, device, contextlib.nullcontext)
    profiler = cProfile.Profile(builtins=True)

    @contextlib.contextmanager
    def timed() -> Iterator[None]:
        profiler.enable()
        yield
        profiler.disable()

    _bursts(call, calls, device, timed)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def chosen_device(choice: str) -> torch.device:
    """``--device``: ``cuda`` and ``cpu`` as named; ``auto`` the first GPU where one is visible."""
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device("cuda", 0) if choice == "cuda" else torch.device("cpu")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--network", default="h100_ib400", choices=list(PRESETS))
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("--commit", default=None, help="the commit of the code measured (default: this checkout's HEAD)")
    p.add_argument(
        "--profile", type=int, default=0, metavar="TOP", help="also print each kind's TOP functions by own time"
    )
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="where the tensors live")
    given = sys.argv[1:] if argv is None else argv
    args = p.parse_args(given)
    if args.calls < 1 or args.profile < 0:
        p.error(f"--calls {args.calls} must be at least 1 and --profile {args.profile} not negative")
    device = chosen_device(args.device)
    world = start_world(0, EP, network_model(args.network), timedelta(minutes=5))
    try:
        calls = cases(device)
        rows = {name: time_calls(call, args.calls, device) * 1e6 for name, call in calls.items()}
        profiles = (
            {name: profile_calls(call, args.calls, device, args.profile) for name, call in calls.items()}
            if args.profile
            else {}
        )
    finally:
        dist.destroy_process_group()
        stop_world()
    print(f"emulated EP={EP} world, network {args.network}, {device.type}, hold kernel {world.hold.kind}")
    for name, us in rows.items():
        print(f"  {name:42s} {us:8.1f} us per call (host)")
    for name, text in profiles.items():
        print(f"\n--- {name}: {args.calls} calls, by own time ---\n{text}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "command": portable_command(
                        ["uv", "run", "python", "scripts/performance/emulation_host_cost.py", *given],
                        {"--json": "runs/emulation_host_cost.json"},
                    ),
                    "commit": args.commit or git_commit(REPO),
                    "device": device.type,
                    "gpu": device_name() if device.type == "cuda" else "no GPU",
                    "host": host_facts(),
                    "network": args.network,
                    "hold": world.hold.kind,
                    "calls": args.calls,
                    "host_us_per_call": rows,
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
