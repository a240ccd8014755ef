"""The network model's presets and formulas, worked out by hand."""

from __future__ import annotations

import pytest

from megatron.bridge.emulation.network import PRESETS, GroupCosts, network_model

H100 = PRESETS["h100_ib400"]
US, GB = 1e-6, 1e9


@pytest.mark.parametrize("kind, ranks, nbytes, expected", [
    ("all_reduce", range(8), 8e6, 5 * US + 2 * 7 / 8 * 8e6 / (450 * GB)),  # one node: NVLink
    ("all_reduce", range(16), 8e6, 15 * US + 2 * 15 / 16 * 8e6 / (50 * GB)),  # two nodes: the NIC
    ("all_gather", range(16), 8e6, 15 * US + 15 / 16 * 8e6 / (50 * GB)),
    ("reduce_scatter", range(4), 8e6, 5 * US + 3 / 4 * 8e6 / (450 * GB)),
    ("broadcast", range(16), 8e6, 15 * US + 8e6 / (50 * GB)),
    ("barrier", range(16), 0, 15 * US),
    ("all_reduce", [5], 8e6, 0.0),
], ids=["ar-node", "ar-2nodes", "ag", "rs-node", "bcast", "barrier", "alone"])
def test_a_collective_costs_latency_plus_its_bytes_over_the_slowest_link(kind, ranks, nbytes, expected):
    assert H100.seconds(kind, list(ranks), nbytes) == pytest.approx(expected)


def test_an_all_to_all_uses_nvlink_and_the_nic_at_once():
    ranks = list(range(16))
    to_peer = [1000] * 16  # rank 0: 7 peers in its node, 8 in the other
    expected = max(5 * US + 7000 / (450 * GB), 15 * US + 8000 / (50 * GB))
    assert H100.all_to_all_seconds(ranks, 0, to_peer) == pytest.approx(expected)
    assert H100.all_to_all_seconds(list(range(8)), 0, [1000] * 8) == pytest.approx(5 * US + 7000 / (450 * GB))


def test_free_costs_nothing_and_every_figure_can_be_overridden():
    assert PRESETS["free"].seconds("all_reduce", list(range(16)), 1e9) == 0.0
    custom = network_model("h100_ib400", inter_node_gbps=25.0, gpus_per_node=4)
    assert custom.inter_node_gbps == 25.0 and custom.gpus_per_node == 4 and custom.intra_node_gbps == 450.0
    with pytest.raises(KeyError, match="presets: h100_ib400"):
        network_model("nope")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_names_its_source(name):
    assert PRESETS[name].source


# one peer per call (the NVSHMEM exchange): rank 1 of 4 ranks, 2 per node; peers 0 (its node), 2, 3 (the other)
@pytest.mark.parametrize("bytes_to_peer, seconds, sent, inter", [
    ([0, 0, 0, 0], 5e-6 + 2 * 15e-6, 0, 0),  # every call pays its latency, even with nothing to send
    ([450, 99, 0, 0], 5e-6 + 1e-9 + 2 * 15e-6, 450, 0),  # its own 99 bytes cross no link
    ([0, 0, 50, 100], 5e-6 + 2 * 15e-6 + 3e-9, 150, 150),  # NIC calls add up, one after another
    ([900, 0, 500, 0], 5e-6 + 2e-9 + 2 * 15e-6 + 10e-9, 1400, 500),  # NVLink and NIC never at once
])
def test_an_exchange_of_one_call_per_peer_adds_every_peers_latency_and_bytes(bytes_to_peer, seconds, sent, inter):
    costs = GroupCosts(network_model("h100_ib400", gpus_per_node=2), range(4), 1)
    got = costs.serial_all_to_all(bytes_to_peer)
    assert got[0] == pytest.approx(seconds, rel=1e-12) and got[1:] == (sent, inter)


def test_a_free_network_prices_one_call_per_peer_at_nothing_but_counts_its_bytes():
    costs = GroupCosts(network_model("free"), range(16), 0)
    assert costs.serial_all_to_all([64] * 16) == (0.0, 15 * 64, 8 * 64)
    assert costs.link_table("cpu").shape == (4, 16)
