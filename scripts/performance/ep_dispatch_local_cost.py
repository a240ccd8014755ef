"""GPU time of the EP sorted dispatcher's own work (permutation, packing, reading, re-sorting), one GPU.

The EP=2 sorted dispatcher moves every token row through static-size buffers; its copies and gathers
run on the GPU beside the all-to-all itself and add to the EP=2 step whatever the transport does.
This script measures that local work alone, at the Qwen3-30B-A3B proxy's MoE shapes (hidden 2048,
128 experts top-8, seq 4096 per micro-batch), as rank 0 of EP=2, on one GPU:

* the dispatcher is :class:`ExpertParallelSortedDispatcher` as the model builds it, driven through
  its six stage methods in the order megatron's MoE layer calls them, forward and backward;
* the all-to-all is replaced by a no-op over the same buffers (the received rows are whatever the
  buffer holds; their values do not change the work, their number does: the copies stop at the
  received total), and the all-gather of the per-expert counts by a copy of this rank's and a
  peer's counts (both from random top-8 routing);
* the experts are replaced by one elementwise product with the routing probabilities, so that both
  gradients flow.

It prints and writes one JSON object: per micro-batch size and schedule (standard, and the
combined-1F1B EP-overlap schedule, whose stage copy differs):

* ``dispatcher_kernel_us``: the GPU time of the kernels of one forward+backward pass (from the
  profiler), less the stand-in's own kernels (profiled alone at the same size): the dispatcher's
  GPU work;
* ``event_fwd_bwd_ms`` (mean, and fastest ``_min``): the time between CUDA events around a pass over
  ``--iters`` passes after a warm-up. It includes the gaps where the GPU waits for the host to launch
  the pass's ~80 kernels, so it says more about launch cost than about the GPU work;
* ``host_issue_us``: the host's own time to enqueue one pass, measured while a sleep kernel holds
  the GPU (so the host never waits for it), mean per pass over a few passes, and
  ``host_waited_for_gpu``: whether the host took about as long as the sleep, which means something
  in the pass waited for the GPU (a synchronisation; the sorted dispatcher must have none). Next to
  ``dispatcher_kernel_us`` it says whether the GPU or the host bounds the dispatcher: in training the
  GPU only stays busy when the host enqueues faster than the GPU runs; ``host_stage_us`` splits it
  by stage (median per stage, one pass at a time with the GPU held);
* the kernel count and the most expensive kernels by name;
* ``output_sha256``: digests of everything one pass produces (received tokens and probabilities,
  tokens per expert, the combined output, the gradients of the tokens and of the probabilities), from
  a pass whose exchange hands this rank's sent rows back as the received ones, so that real data
  flows through every copy. Equal digests at two commits mean the dispatcher computes the same bits
  (``repeatable``: two passes gave the same digests).

    python scripts/performance/ep_dispatch_local_cost.py --out ep_dispatch_local_cost.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from megatron.bridge.models.torch_native.sorted_dispatcher import ExpertParallelSortedDispatcher
from megatron.bridge.models.torch_native.token_exchange import CollectiveExchange, Route, RowExchange
from megatron.bridge.perf.harness.results import argv_without
from megatron.bridge.training.telemetry.step_timing import host_enqueue_s, park_gpu

HIDDEN, EXPERTS, TOPK, SEQ, EP = 2048, 128, 8, 4096, 2


class NoOpExchange(CollectiveExchange):
    """The dispatcher's buffers and packing without the transfer: ``_run`` returns the receive buffer."""

    name = "no-op (local work only)"
    sync_free = True

    def __init__(self) -> None:
        super().__init__(group=None, world=EP)  # no process group: nothing is sent

    def _run(self, slot: int, route: Route) -> torch.Tensor:
        return self._recv


class LoopbackExchange(NoOpExchange):
    """Hands back this rank's sent rows as the received ones (zeros past them): every copy moves real
    data, as in a real exchange, so a pass's outputs follow from its inputs and the code alone."""

    name = "loopback (output digests only)"

    def _run(self, slot: int, route: Route) -> torch.Tensor:
        send = self._send[slot]
        sent = torch.arange(send.shape[0], device=send.device) < route.send_splits.sum()
        return torch.where(sent[:, None], send, torch.zeros((), dtype=send.dtype, device=send.device))


def random_routing(tokens: int, generator: torch.Generator, device: str = "cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """A top-8 routing map and its probabilities, as megatron's router hands them to the dispatcher."""
    scores = torch.rand(tokens, EXPERTS, generator=generator)
    top = scores.topk(TOPK, dim=1)
    routing_map = torch.zeros(tokens, EXPERTS, dtype=torch.bool).scatter_(1, top.indices, True)
    probs = torch.zeros(tokens, EXPERTS).scatter_(1, top.indices, top.values.softmax(dim=1))
    return routing_map.to(device), probs.to(device)


def make_dispatcher(overlap: bool, exchange: RowExchange) -> ExpertParallelSortedDispatcher:
    """The EP=2 rank-0 dispatcher without megatron's parallel state (its groups are not used here)."""
    d = object.__new__(ExpertParallelSortedDispatcher)
    d.config = SimpleNamespace(moe_router_topk=TOPK, overlap_moe_expert_parallel_comm=overlap)
    d.ep_size, d.ep_rank, d.num_local_experts, d.ep_group = EP, 0, EXPERTS // EP, None
    d.transport, d._plan, d.rank_capacity_factor = "no-op", None, None
    d._exchange = lambda device: exchange
    return d


def fake_all_gather(peer_counts: torch.Tensor):
    """``all_gather_into_tensor`` over EP=2 as rank 0: this rank's counts, then the peer's."""

    def gather(out: torch.Tensor, counts: torch.Tensor, group=None) -> None:
        out.copy_(torch.cat([counts, peer_counts]))

    return gather


def expert_stand_in(tokens: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """What stands in for the experts: the rows scaled by their routing probabilities."""
    return tokens * probs.unsqueeze(-1).to(tokens.dtype)


#: The parts of a pass whose host time ``host_stage_us`` reports, in order.
PASS_PARTS = (
    "dispatch_preprocess",
    "token_dispatch",
    "dispatch_postprocess",
    "stand_in",
    "combine_preprocess_and_token_combine",
    "combine_postprocess",
    "backward",
)


def one_pass(
    d: ExpertParallelSortedDispatcher,
    x: torch.Tensor,
    routing_map: torch.Tensor,
    probs: torch.Tensor,
    grad: torch.Tensor,
    marks: list[float] | None = None,
    outputs: dict | None = None,
):
    """Forward and backward through the six stages, in the MoE layer's order; with ``marks``, the
    host clock is appended before the pass and after each of :data:`PASS_PARTS`; ``outputs`` gets
    what the pass produced (and ``received``, the received row count, on the device)."""

    def mark() -> None:
        if marks is not None:
            marks.append(time.perf_counter())

    x.grad = probs.grad = None  # no accumulation into earlier passes' gradients
    mark()
    tokens, permuted_probs = d.dispatch_preprocess(x, routing_map, probs)
    mark()
    tokens, permuted_probs = d.token_dispatch(tokens, permuted_probs)
    received = d._plan.recv_total
    mark()
    tokens, tokens_per_expert, permuted_probs = d.dispatch_postprocess(tokens, permuted_probs)
    mark()
    expert_out = expert_stand_in(tokens, permuted_probs)
    mark()
    combined = d.token_combine(d.combine_preprocess(expert_out))
    mark()
    out = d.combine_postprocess(combined)
    mark()
    out.backward(grad)
    mark()
    if outputs is not None:
        outputs.update(
            received_tokens=tokens,
            received_probs=permuted_probs,
            tokens_per_expert=tokens_per_expert,
            combined=out,
            tokens_grad=x.grad,
            probs_grad=probs.grad,
            received=received,
        )


def _sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:16]


def output_digests(overlap: bool, x: torch.Tensor, routing_map: torch.Tensor, probs: torch.Tensor) -> dict:
    """Digests of one pass's outputs through :class:`LoopbackExchange` (received rows up to the
    received total; a seeded random output gradient), and whether a second pass repeats them."""
    d = make_dispatcher(overlap, LoopbackExchange())
    g = torch.Generator().manual_seed(7)
    grad = torch.randn(x.shape, generator=g).to(device=x.device, dtype=x.dtype)
    passes = []
    for _ in range(2):
        outputs: dict = {}
        one_pass(d, x, routing_map, probs, grad, outputs=outputs)
        received = int(outputs.pop("received"))
        outputs["received_tokens"] = outputs["received_tokens"][:received]
        outputs["received_probs"] = outputs["received_probs"][:received]
        passes.append({name: _sha256(t) for name, t in outputs.items()})
    return dict(passes[1], repeatable=passes[0] == passes[1])


def host_stage_us(pass_with_marks, passes: int, park_s: float = 0.1) -> dict[str, float]:
    """Median host time of each of :data:`PASS_PARTS` over ``passes`` passes, each enqueued while
    the GPU sleeps (one pass at a time: a pass never fills CUDA's launch queue)."""
    parts: dict[str, list[float]] = {name: [] for name in PASS_PARTS}
    for _ in range(passes):
        marks: list[float] = []
        torch.cuda.synchronize()
        park_gpu(park_s)
        pass_with_marks(marks)
        torch.cuda.synchronize()
        for name, start, end in zip(PASS_PARTS, marks, marks[1:]):
            parts[name].append(1e6 * (end - start))
    return {name: statistics.median(times) for name, times in parts.items()}


def stand_in_pass(tokens: torch.Tensor, probs: torch.Tensor, grad: torch.Tensor) -> None:
    """The stand-in's own forward and backward at the receive buffer's size (subtracted below)."""
    tokens.grad = probs.grad = None
    expert_stand_in(tokens, probs).backward(grad)


def kernel_times(fn) -> list[tuple[str, float]]:
    """``(name, microseconds)`` of every GPU kernel (and device memset/copy) that ``fn()`` runs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [
        (e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
    ]


def host_issue_us(fn, passes: int = 5, park_s: float = 0.1) -> tuple[float, bool]:
    """Host microseconds per ``fn()`` while the GPU sleeps, and whether the host waited for it."""
    seconds, waited = host_enqueue_s(fn, passes, park_s)
    return 1e6 * seconds, waited


def measure(mbs: int, overlap: bool, iters: int, top_kernels: int) -> dict:
    gen = torch.Generator().manual_seed(mbs)
    tokens = SEQ * mbs
    routing_map, probs = random_routing(tokens, gen)
    peer_map, _ = random_routing(tokens, gen)
    dist.all_gather_into_tensor = fake_all_gather(peer_map.sum(0).long())
    # seeded like the routing, so that the output digests of two runs (two commits) can be compared
    x = torch.randn(tokens, HIDDEN, generator=gen).to(device="cuda", dtype=torch.bfloat16).requires_grad_(True)
    probs.requires_grad_(True)
    d = make_dispatcher(overlap, NoOpExchange())
    grad = torch.ones(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16)
    rows = d._capacity(tokens)  # the stand-in's inputs, made outside the profiled passes
    stand_in_args = (
        torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=True),
        torch.rand(rows, device="cuda", requires_grad=True),
        torch.ones(rows, HIDDEN, device="cuda", dtype=torch.bfloat16),
    )
    for _ in range(3):
        one_pass(d, x, routing_map, probs, grad)
        stand_in_pass(*stand_in_args)
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        one_pass(d, x, routing_map, probs, grad)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    host = [host_issue_us(lambda: one_pass(d, x, routing_map, probs, grad)) for _ in range(iters)]
    stages = host_stage_us(lambda marks: one_pass(d, x, routing_map, probs, grad, marks), iters)
    kernels = kernel_times(lambda: one_pass(d, x, routing_map, probs, grad))
    digests = output_digests(overlap, x, routing_map, probs)
    stand_in_us = sum(us for _, us in kernel_times(lambda: stand_in_pass(*stand_in_args)))
    by_name: dict[str, list[float]] = {}
    for name, us in kernels:
        by_name.setdefault(name[:90], []).append(us)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top_kernels]
    total_us = sum(us for _, us in kernels)
    local_rows = int(routing_map[:, : EXPERTS // EP].sum() + peer_map[:, : EXPERTS // EP].sum())
    return dict(
        mbs=mbs,
        schedule="ep_overlap" if overlap else "standard",
        tokens=tokens,
        received_rows=local_rows,
        capacity_rows=d._capacity(tokens),
        event_fwd_bwd_ms=1e3 * statistics.fmean(times),
        event_fwd_bwd_ms_min=1e3 * min(times),
        host_issue_us=statistics.fmean(us for us, _ in host),
        host_issue_us_min=min(us for us, _ in host),
        host_waited_for_gpu=any(waited for _, waited in host),
        host_stage_us=stages,
        kernels_per_pass=len(kernels),
        kernel_us_per_pass=total_us,
        expert_stand_in_us=stand_in_us,
        dispatcher_kernel_us=total_us - stand_in_us,
        top_kernels=[dict(name=name, calls=len(us), total_us=sum(us)) for name, us in top],
        output_sha256=digests,
    )


def measured_argv(argv: list[str]) -> list[str]:
    """The arguments that say what was measured: ``--out`` (where it was written) left out."""
    return argv_without(argv, "--out")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mbs", type=int, nargs="+", default=[1, 2])
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--label", default="", help="recorded with the results (for example the commit)")
    p.add_argument("--top-kernels", type=int, default=12, help="kernels listed by their GPU time in one pass")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    rows = [measure(mbs, overlap, args.iters, args.top_kernels) for mbs in args.mbs for overlap in (False, True)]
    result = dict(
        label=args.label,
        device=torch.cuda.get_device_name(0),
        torch=torch.__version__,
        command="python scripts/performance/ep_dispatch_local_cost.py " + shlex.join(measured_argv(sys.argv[1:])),
        rows=rows,
    )
    text = json.dumps(result, indent=2)
    print(text, flush=True)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
