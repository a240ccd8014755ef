"""The sorted dispatchers' index computations and their CUDA-graph replay (``index_graph.py``).

CUDA graphs need a GPU (``tests/gpu_checks/index_graph.py`` checks the replay bit for bit there);
on CPU these tests cover what does not: the routing indices themselves, how a replay's flat output
is cut into outputs and copied out, and the eager way out after a failed capture.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from megatron.bridge.models.torch_native import index_graph
from megatron.bridge.models.torch_native.index_graph import GraphedIndexFunction, _Captured
from megatron.bridge.models.torch_native.sorted_exchange import routing_and_plan
from megatron.bridge.models.torch_native.sorted_permutation import permutation_indices, routing_indices, sorted_routing


def _routing_map(tokens: int, experts: int, topk: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    top = torch.rand(tokens, experts, generator=g).topk(topk, dim=1).indices
    return torch.zeros(tokens, experts, dtype=torch.bool).scatter_(1, top, True)


@pytest.mark.parametrize("tokens,experts,topk", [(1, 4, 2), (7, 8, 2), (64, 128, 8), (33, 6, 6)])
def test_prob_index_picks_each_rows_token_and_expert_probability(tokens, experts, topk) -> None:
    routing_map = _routing_map(tokens, experts, topk)
    probs = torch.rand(tokens, experts) * routing_map
    expert_idx, order, _ = sorted_routing(routing_map, topk)
    src_token, _, prob_index, tokens_per_expert = routing_indices(routing_map, topk)
    expected = probs.gather(1, expert_idx).reshape(-1).index_select(0, order)
    assert torch.equal(probs.reshape(-1).index_select(0, prob_index), expected)
    assert torch.equal(prob_index // experts, src_token)
    assert tokens_per_expert.tolist() == routing_map.sum(0).tolist()


def _indices(x: torch.Tensor, scale: int) -> tuple:
    return (x * scale, (x + 1).reshape(2, -1), x.sum().reshape(1))


class _FakeGraph:
    """Stands in for a captured CUDA graph: a replay recomputes into the captured output buffer."""

    def __init__(self, inputs, flat, scale):
        self.inputs, self.flat, self.scale = inputs, flat, scale

    def replay(self):
        self.flat.copy_(torch.cat([o.reshape(-1) for o in _indices(*self.inputs, self.scale)]))


def test_a_replay_copies_inputs_in_and_outputs_out_in_their_shapes() -> None:
    static = (torch.zeros(6, dtype=torch.long),)
    flat = torch.zeros(13, dtype=torch.long)
    captured = _Captured(
        _FakeGraph(static, flat, 3), static, flat, (torch.Size([6]), torch.Size([2, 3]), torch.Size([1]))
    )
    x = torch.arange(6)
    got = captured.replay((x,))
    assert all(torch.equal(a, b) for a, b in zip(got, _indices(x, 3)))
    flat.fill_(-1)  # the next replay overwrites the buffer: earlier outputs must not change
    assert all(torch.equal(a, b) for a, b in zip(got, _indices(x, 3)))


def test_on_cpu_the_function_runs_eagerly_without_a_capture() -> None:
    fn = GraphedIndexFunction(_indices, "test indices")
    x = torch.arange(6)
    assert all(torch.equal(a, b) for a, b in zip(fn(x, scale=2), _indices(x, 2)))
    assert fn._graphs == {} and not fn.failed


def test_a_failed_capture_is_logged_once_and_the_function_runs_eagerly(monkeypatch, caplog) -> None:
    fn = GraphedIndexFunction(_indices, "test indices")
    attempts = []

    def failing_capture(*args):
        attempts.append(args)
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(fn, "_capture", failing_capture)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(fn, "_replayable", lambda tensors: not fn.failed)
    x = torch.arange(6)
    with caplog.at_level(logging.WARNING, logger=index_graph.__name__):
        for _ in range(3):
            assert all(torch.equal(a, b) for a, b in zip(fn(x, scale=5), _indices(x, 5)))
    assert fn.failed and len(attempts) == 1
    assert [r.getMessage() for r in caplog.records if "capture failed" in r.getMessage()] == [
        "torch_native test indices: CUDA graph capture failed (operation not permitted when stream is capturing); "
        "running it eagerly"
    ]


def test_ep_indices_and_plan_are_the_routing_indices_and_the_plan() -> None:
    from megatron.bridge.models.torch_native.sorted_exchange import plan_tensors

    routing_map = _routing_map(16, 8, 2, seed=3)
    peer = _routing_map(16, 8, 2, seed=4)
    all_counts = torch.stack([routing_map.sum(0), peer.sum(0)]).long()
    got = routing_and_plan(routing_map, all_counts, topk=2, rank=1, num_local_experts=4, capacity=64, expert_rows=40)
    want = (*permutation_indices(routing_map, 2), *plan_tensors(all_counts, 1, 4, 64, 40))
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    assert {t.dtype for t in got} == {torch.long}  # one dtype: the replay copies them out as one buffer


def test_shapes_beyond_the_graph_limit_run_eagerly_and_say_so_once(monkeypatch, caplog) -> None:
    fn = GraphedIndexFunction(_indices, "test indices", max_graphs=2)
    captures = []

    def fake_capture(tensors, constants, stream):
        captures.append(tensors[0].shape)
        static = tuple(t.clone() for t in tensors)
        outputs = _indices(*static, **constants)
        flat = torch.cat([o.reshape(-1) for o in outputs])
        return _Captured(_FakeGraph(static, flat, constants["scale"]), static, flat, tuple(o.shape for o in outputs))

    monkeypatch.setattr(fn, "_capture", fake_capture)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(fn, "_replayable", lambda tensors: True)
    with caplog.at_level(logging.WARNING, logger=index_graph.__name__):
        for length in (2, 4, 2, 6, 8, 4):
            x = torch.arange(length)
            assert all(torch.equal(a, b) for a, b in zip(fn(x, scale=3), _indices(x, 3)))
    assert captures == [torch.Size([2]), torch.Size([4])]  # lengths 6 and 8 ran eagerly
    assert sum("2 CUDA graphs already" in r.getMessage() for r in caplog.records) == 1
