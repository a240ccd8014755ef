"""The node-aware dispatcher's pieces on one process: node layouts, the indices of both hops against
host references, and when the dispatcher is chosen (``auto`` never picks it: it is not measured).
Its agreement with megatron's dispatcher over four gloo ranks is in
``tests/functional_tests/test_node_aware_dispatch.py``."""

from __future__ import annotations

import itertools

import pytest
import torch

from megatron.bridge.models.dispatch.node_aware import node_layout_problem
from megatron.bridge.models.dispatch.path_registry import choose_dispatch
from megatron.bridge.models.torch_native.node_aware_dispatcher import (
    copy_slots,
    expert_order,
    fan_out,
    node_copies,
    stage_splits,
)
from megatron.bridge.models.torch_native.node_groups import NodeLayout, node_layout, node_ranks, rail_ranks


@pytest.mark.parametrize(
    "ranks,gpus_per_node,expected",
    [
        ([0, 1, 2, 3], 2, (2, 2)),
        ([0, 1, 2, 3], 4, (1, 4)),  # EP inside one node: one stage
        ([4, 5, 6, 7], 8, (1, 4)),
        ([0, 1, 2, 3], 1, (4, 1)),  # one GPU per node: no hop inside a node
        ([8, 9, 10, 11, 12, 13, 14, 15], 4, (2, 4)),
    ],
)
def test_node_layout_of_regular_ep_groups(ranks, gpus_per_node, expected) -> None:
    for ep_rank in range(len(ranks)):
        layout = node_layout(ranks, ep_rank, gpus_per_node)
        assert (layout.nodes, layout.per_node) == expected
        assert layout.ep_rank(layout.node, layout.local) == ep_rank


@pytest.mark.parametrize("ranks,gpus_per_node", [([0, 1, 2], 2), ([0, 1, 2, 3, 4, 5], 4), ([2, 3, 4, 5], 3)])
def test_an_ep_group_that_straddles_nodes_unevenly_is_refused(ranks, gpus_per_node) -> None:
    with pytest.raises(ValueError, match="equal runs per node"):
        node_layout(ranks, 0, gpus_per_node)


def test_rails_hold_one_rank_per_node_and_nodes_their_consecutive_ranks() -> None:
    ranks = [6, 7, 8, 9, 10, 11]
    layout = node_layout(ranks, 0, 3)
    assert node_ranks(ranks, layout) == [(6, 7, 8), (9, 10, 11)]
    assert rail_ranks(ranks, layout) == [(6, 9), (7, 10), (8, 11)]


@pytest.mark.parametrize(
    "ep,gpus_per_node,ok",
    [
        (4, 2, True),
        (16, 8, True),
        (4, 8, True),
        (4, 4, True),
        (4, 1, True),
        (12, 8, False),
        (8, 3, False),
        (4, None, False),
        (4, 0, False),
    ],
)
def test_node_layout_problem(ep, gpus_per_node, ok) -> None:
    assert (node_layout_problem(ep, gpus_per_node) is None) is ok


def _routing(seed: int, tokens: int, experts: int, topk: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    routing_map = torch.zeros(tokens, experts, dtype=torch.bool)
    for t in range(tokens):
        routing_map[t, torch.randperm(experts, generator=g)[:topk]] = True
    return routing_map


@pytest.mark.parametrize("seed,nodes,topk", [(0, 2, 3), (1, 4, 2), (2, 1, 3), (3, 2, 1), (4, 8, 4)])
def test_node_copies_and_slots_against_a_host_reference(seed, nodes, topk) -> None:
    tokens, experts = 7, 8
    routing_map = _routing(seed, tokens, experts, topk)
    per_node = experts // nodes
    hit = routing_map.view(tokens, nodes, per_node).any(-1)
    expected = [(n, t) for n in range(nodes) for t in range(tokens) if hit[t, n]]  # node-major
    width, slot_width = min(topk, nodes), min(topk, per_node)
    token, node, pos = node_copies(hit, len(expected), width)
    assert list(zip(node.tolist(), token.tolist())) == expected
    for t in range(tokens):
        rows = [i for i, (_, tt) in enumerate(expected) if tt == t]
        assert pos[t].tolist() == (rows + [len(expected)] * width)[:width]
    slots, prob_index = copy_slots(routing_map, token, node, nodes, slot_width)
    for i, (n, t) in enumerate(expected):
        ids = [e - n * per_node for e in range(n * per_node, (n + 1) * per_node) if routing_map[t, e]]
        assert slots[i].tolist() == ids + [-1] * (slot_width - len(ids))
        flat = [t * experts + n * per_node + e for e in ids] + [tokens * experts] * (slot_width - len(ids))
        assert prob_index.view(-1, slot_width)[i].tolist() == flat


def test_fan_out_orders_rows_by_expert_then_copy_and_pads_empty_slots() -> None:
    slots = torch.tensor([[1, 3, -1], [0, 1, 2], [3, -1, -1]], dtype=torch.int32)
    used = int((slots >= 0).sum())
    copy, slot, pos = fan_out(slots, per_node_experts=4, total=used)
    expected = sorted(((int(e), c, s) for c, row in enumerate(slots.tolist()) for s, e in enumerate(row) if e >= 0))
    assert copy.tolist() == [c for _, c, _ in expected]
    assert slot.tolist() == [c * 3 + s for _, c, s in expected]
    for i, (_, c, s) in enumerate(expected):
        assert pos[c, s] == i
    assert pos[0, 2] == pos[2, 1] == pos[2, 2] == used


def test_expert_order_is_megatrons_order_of_the_arrived_rows() -> None:
    g = torch.Generator().manual_seed(5)
    arrivals = torch.randint(0, 4, (2, 3, 2), generator=g)  # [source GPU, local expert, source node]
    arrived = [
        (gpu, e, n, j) for gpu in range(2) for e in range(3) for n in range(2) for j in range(int(arrivals[gpu, e, n]))
    ]
    megatron = sorted(arrived, key=lambda r: (r[1], r[2], r[0], r[3]))  # expert, source EP rank (node-major), token
    index = expert_order(arrivals, len(arrived))
    assert [arrived[i] for i in index.tolist()] == megatron


def test_stage_splits_agree_with_counting_rows_by_hand() -> None:
    """Two nodes of two GPUs, two experts per GPU: every rank's hop sizes from the gathered counts."""
    nodes, per_node, local = 2, 2, 2
    experts, ep = nodes * per_node * local, nodes * per_node
    maps = [_routing(10 + r, 6, experts, 3) for r in range(ep)]
    counts = torch.stack([torch.cat([m.sum(0), m.view(6, nodes, -1).any(-1).sum(0)]) for m in maps]).long()
    node_of, gpu_of = (lambda e: e // (per_node * local)), (lambda e: e // local % per_node)
    for node, me in itertools.product(range(nodes), range(per_node)):
        splits = stage_splits(counts, NodeLayout(nodes, per_node, node, me), local)
        mine = maps[node * per_node + me]
        assert splits.send_a == [int(mine.view(6, nodes, -1).any(-1)[:, n].sum()) for n in range(nodes)]
        assert splits.recv_a == [
            int(maps[n * per_node + me].view(6, nodes, -1).any(-1)[:, node].sum()) for n in range(nodes)
        ]
        # hop (b): rows of the tokens arrived over this rank's rail, for each GPU of the node
        rail = [maps[n * per_node + me] for n in range(nodes)]
        assert splits.send_b == [
            sum(int(m[:, e].sum()) for m in rail for e in range(experts) if node_of(e) == node and gpu_of(e) == j)
            for j in range(per_node)
        ]
        assert sum(splits.recv_b) == int(
            sum(m[:, [e for e in range(experts) if node_of(e) == node and gpu_of(e) == me]].sum() for m in maps)
        )


class _Config:
    """The config fields :func:`choose_dispatch` reads."""

    def __init__(self, **overrides):
        self.torch_native_dispatcher = "node_aware"
        self.torch_native_gpus_per_node = 2
        self.torch_native_ep_transport = "auto"
        self.torch_native_nvshmem_blocks = None
        self.moe_token_dispatcher_type = "alltoall"
        self.moe_expert_capacity_factor = None
        self.moe_pad_expert_input_to_capacity = False
        self.moe_router_padding_for_quantization = False
        self.moe_shared_expert_overlap = False
        self.moe_latent_size = None
        self.cuda_graph_impl = "none"
        self.transformer_impl = "local"
        self.pipeline_model_parallel_size = 1
        self.__dict__.update(overrides)


@pytest.mark.parametrize(
    "ep,gpus_per_node,shape",
    [(4, 2, "2 nodes x 2 GPUs"), (16, 8, "2 nodes x 8 GPUs"), (4, 8, "EP inside one node: one stage")],
)
def test_node_aware_is_chosen_when_asked_for_and_says_its_node_shape(ep, gpus_per_node, shape) -> None:
    choice = choose_dispatch(_Config(torch_native_gpus_per_node=gpus_per_node), ep, 1, None, torch.device("cpu"))
    assert (choice.dispatcher, choice.sync_free, choice.index_graph) == ("node_aware", False, False)
    assert shape in choice.reason and choice.describe().startswith("node-aware dispatcher, host-synchronised")


@pytest.mark.parametrize("ep", [2, 4, 16])
def test_auto_never_picks_node_aware_it_was_not_faster_with_overlap_on(ep) -> None:
    choice = choose_dispatch(_Config(torch_native_dispatcher="auto"), ep, 1, None, torch.device("cpu"))
    assert choice.dispatcher == "megatron"


@pytest.mark.parametrize(
    "overrides,ep,blocker",
    [
        ({"torch_native_gpus_per_node": None}, 4, "not a GPU count"),
        ({"torch_native_gpus_per_node": 3}, 4, "neither divides"),
        ({}, 1, "EP=1"),
        ({"torch_native_ep_transport": "nccl"}, 4, "setting of the sorted dispatcher"),
        ({"moe_expert_capacity_factor": 1.0}, 4, "token dropping"),
        ({"pipeline_model_parallel_size": 2}, 4, "pipeline parallelism"),
    ],
)
def test_node_aware_that_cannot_run_is_an_error_naming_why(overrides, ep, blocker) -> None:
    with pytest.raises(ValueError, match=blocker):
        choose_dispatch(_Config(**overrides), ep, 1, None, torch.device("cpu"))
