"""The one-peer-per-call order that the NVSHMEM transport follows and the network model prices."""

from __future__ import annotations

import pytest
import torch

from megatron.bridge.utils.pairwise_calls import call_peer


@pytest.mark.parametrize("world", [1, 2, 4, 8, 16, 32])
def test_every_call_pairs_ranks_both_ways_and_every_rank_meets_every_peer_once(world):
    for rank in range(world):
        peers = [call_peer(rank, k, world) for k in range(world)]
        assert peers[0] == rank and sorted(peers) == list(range(world))
        assert all(call_peer(peer, k, world) == rank for k, peer in enumerate(peers))


@pytest.mark.parametrize("world, gpus_per_node", [(16, 8), (32, 8), (8, 4), (16, 4)])
def test_the_calls_inside_a_node_come_first_and_hold_no_pair_across_nodes(world, gpus_per_node):
    def crosses(k: int) -> set[bool]:
        return {rank // gpus_per_node != call_peer(rank, k, world) // gpus_per_node for rank in range(world)}

    assert all(crosses(k) == {False} for k in range(1, gpus_per_node))
    assert all(crosses(k) == {True} for k in range(gpus_per_node, world))


def test_a_tensor_of_calls_gives_each_calls_peer():
    assert call_peer(5, torch.arange(8), 8).tolist() == [call_peer(5, k, 8) for k in range(8)]


@pytest.mark.parametrize("world", [0, 3, 6, 12])
def test_a_group_that_is_not_a_power_of_two_is_refused(world):
    with pytest.raises(ValueError, match=f"power of two, not {world}"):
        call_peer(0, 1, world)
