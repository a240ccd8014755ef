"""GPU check: the sorted dispatchers' index computations replayed from CUDA graphs.

One GPU: ``python tests/gpu_checks/index_graph.py``. At the Qwen3-30B-A3B proxy's shapes (128
experts, top-8; 4,096 and 8,192 tokens; EP=2 plan as rank 0 with 64 local experts), for several
random routing maps in a row (each replay sees new inputs), on the default and on a second stream,
and inside an outer capture (the function then runs eagerly and the outer graph records it):

* whether every output of the graphed function is bit for bit the eager function's;
* the host's time to enqueue one call, eager and graphed, with the GPU held by a sleep kernel (so the
  host never waits for it), and the GPU time of one call.
"""

import statistics

import torch

from megatron.bridge.models.torch_native.sorted_exchange import graphed_routing_and_plan, routing_and_plan
from megatron.bridge.models.torch_native.sorted_permutation import graphed_routing_indices, routing_indices
from megatron.bridge.training.telemetry.step_timing import host_enqueue_s, park_gpu

EXPERTS, TOPK, EP = 128, 8, 2


def routing_map(tokens: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    top = torch.rand(tokens, EXPERTS, generator=g).topk(TOPK, dim=1).indices
    return torch.zeros(tokens, EXPERTS, dtype=torch.bool).scatter_(1, top, True).cuda()


def host_us(fn, calls: int = 10, park_s: float = 0.05) -> float:
    seconds, waited = host_enqueue_s(fn, calls, park_s)
    if waited:
        raise RuntimeError("the host waited for the GPU: a synchronisation in the function")
    return 1e6 * seconds


def gpu_us(fn, calls: int = 10) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    park_gpu(0.01)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / calls


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)


def cases(tokens: int):
    """(name, graphed call, eager call) for the EP=1 indices and the EP=2 indices + plan."""
    capacity = EP * tokens * TOPK
    plan_kwargs = dict(topk=TOPK, rank=0, num_local_experts=EXPERTS // EP, capacity=capacity, expert_rows=capacity)

    def counts(m: torch.Tensor, peer: torch.Tensor) -> torch.Tensor:
        return torch.stack([m.sum(0), peer.sum(0)]).long()

    return [
        ("indices", lambda m, p: graphed_routing_indices(m, topk=TOPK), lambda m, p: routing_indices(m, TOPK)),
        (
            "indices+plan",
            lambda m, p: graphed_routing_and_plan(m, counts(m, p), **plan_kwargs),
            lambda m, p: routing_and_plan(m, counts(m, p), **plan_kwargs),
        ),
    ]


def main() -> None:
    side = torch.cuda.Stream()
    for tokens in (4096, 8192):
        maps = [routing_map(tokens, seed) for seed in range(6)]
        for name, graphed, eager in cases(tokens):
            equal = all(same(graphed(m, p), eager(m, p)) for m, p in zip(maps, maps[1:]))
            with torch.cuda.stream(side):
                equal_side = all(same(graphed(m, p), eager(m, p)) for m, p in zip(maps, maps[1:]))
            torch.cuda.synchronize()
            outer = torch.cuda.CUDAGraph()
            with torch.cuda.graph(outer):
                captured = graphed(maps[0], maps[1])
            outer.replay()
            torch.cuda.synchronize()
            equal_outer = same(captured, eager(maps[0], maps[1]))
            m, p = maps[0], maps[1]
            host_eager = statistics.median(host_us(lambda: eager(m, p)) for _ in range(5))
            host_graph = statistics.median(host_us(lambda: graphed(m, p)) for _ in range(5))
            print(
                f"{tokens} {name}: bitwise equal {equal}, on a second stream {equal_side}, inside a capture "
                f"{equal_outer}; host us per call eager {host_eager:.0f}, graphed {host_graph:.0f}; GPU us per "
                f"call eager {gpu_us(lambda: eager(m, p)):.0f}, graphed {gpu_us(lambda: graphed(m, p)):.0f}",
                flush=True,
            )
    print("capture failed in this process:", graphed_routing_indices.failed or graphed_routing_and_plan.failed)


if __name__ == "__main__":
    main()
