"""The network model's presets and formulas, worked out by hand, and checked against published NCCL
figures for DGX H100 nodes (the sources are the preset's ``FIGURE_SOURCES``)."""

from __future__ import annotations

import pytest

from megatron.bridge.emulation.network import (
    FIGURE_SOURCES,
    PRESETS,
    Charge,
    GroupCosts,
    network_model,
    nic_queue_end,
)

H100 = PRESETS["h100_ib400"]
US, GB = 1e-6, 1e9
NVLINK, NIC = 370 * GB, 47 * GB  # achievable, per direction


@pytest.mark.parametrize(
    "kind, ranks, nbytes, expected",
    [
        ("all_reduce", range(8), 8e6, 5 * US + 2 * 7 / 8 * 8e6 / NVLINK),  # one node: NVLink
        # two nodes, 8 GPUs each: the rings use all 8 NICs of a node (8 x 47 = 376 GB/s), NVLink (370) is slower
        ("all_reduce", range(16), 8e6, 15 * US + 2 * 15 / 16 * 8e6 / NVLINK),
        ("all_gather", range(16), 8e6, 15 * US + 15 / 16 * 8e6 / NVLINK),
        ("reduce_scatter", range(4), 8e6, 5 * US + 3 / 4 * 8e6 / NVLINK),
        ("broadcast", range(16), 8e6, 15 * US + 8e6 / NVLINK),
        ("all_reduce", [0, 1, 8, 9], 8e6, 15 * US + 2 * 3 / 4 * 8e6 / (2 * NIC)),  # two GPUs a node: their 2 NICs
        ("all_reduce", [0, 8], 8e6, 15 * US + 8e6 / NIC),  # one GPU a node: one NIC, no NVLink hop
        ("barrier", range(16), 0, 15 * US),
        ("all_reduce", [5], 8e6, 0.0),
    ],
    ids=["ar-node", "ar-2nodes", "ag-2nodes", "rs-node", "bcast", "ar-2-per-node", "ar-1-per-node", "barrier", "alone"],
)
def test_a_ring_collective_costs_latency_plus_its_bytes_over_its_bus_bandwidth(kind, ranks, nbytes, expected):
    assert H100.seconds(kind, list(ranks), nbytes) == pytest.approx(expected)


@pytest.mark.parametrize(
    "ranks, published_gbps",
    [
        (range(8), (365, 370)),  # one DGX H100, NCCL_ALGO=Ring: NVIDIA/nccl#1455
        (range(16), (365, 384)),  # two nodes over 8 NDR NICs each: 8 x 46-48 GB/s, capped by NVLink's 365-370
    ],
)
def test_a_large_all_reduce_reaches_the_bus_bandwidth_nccl_tests_publish(ranks, published_gbps):
    """nccl-tests' bus bandwidth of a 1 GiB all-reduce, ``2(n-1)/n * size / time``, from the model."""
    ranks, size = list(ranks), 2**30
    n = len(ranks)
    bus_gbps = 2 * (n - 1) / n * size / H100.seconds("all_reduce", ranks, size) / GB
    assert published_gbps[0] <= bus_gbps <= published_gbps[1]


def test_a_ring_across_nodes_keeps_the_nic_busy_for_its_transfer_and_one_node_not_at_all():
    cost = GroupCosts(H100, range(16), 3).ring("reduce_scatter", 8_000_000)
    assert cost.nic_seconds == pytest.approx(15 / 16 * 8e6 / NVLINK) and cost.inter_node_bytes == 7_500_000
    assert GroupCosts(H100, range(8), 3).ring("reduce_scatter", 8_000_000).nic_seconds == 0.0


def test_an_all_to_all_uses_nvlink_and_its_share_of_the_nics_at_once():
    to_peer = [1000] * 16  # rank 0: 7 peers in its node, 8 in the other
    nvlink, nic = 5 * US + 7000 / NVLINK, 15 * US + 8000 / NIC
    assert GroupCosts(H100, range(16), 0).all_to_all(to_peer) == (max(nvlink, nic), 8000 / NIC, 15000, 8000)
    assert H100.all_to_all_seconds(list(range(8)), 0, [1000] * 8) == pytest.approx(5 * US + 7000 / NVLINK)


def test_free_costs_nothing_and_every_figure_can_be_overridden():
    assert PRESETS["free"].seconds("all_reduce", list(range(16)), 1e9) == 0.0
    custom = network_model("h100_ib400", inter_node_gbps=25.0, gpus_per_node=4, nics_per_gpu=2.0)
    assert (custom.inter_node_gbps, custom.gpus_per_node, custom.intra_node_gbps) == (25.0, 4, 370.0)
    assert custom.nic_share_gbps == 50.0
    with pytest.raises(KeyError, match="presets: h100_ib400"):
        network_model("nope")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_names_its_source_and_records_every_figure(name):
    figures = PRESETS[name].figures()
    assert PRESETS[name].source and figures["sources"] == dict(FIGURE_SOURCES)
    assert {
        "intra_node_gbps",
        "inter_node_gbps",
        "nics_per_gpu",
        "intra_node_line_gbps",
        "nic_share_gbps",
        "intra_node_latency_us",
        "inter_node_latency_us",
        "comm_sms",
        "gpus_per_node",
    } <= set(figures)


def test_the_hopper_presets_price_at_achievable_not_line_rates():
    for name in ("h100_ib400", "h200_ib400"):
        p = PRESETS[name]
        assert (p.intra_node_gbps, p.intra_node_line_gbps, p.inter_node_gbps, p.inter_node_line_gbps) == (
            370.0,
            450.0,
            47.0,
            50.0,
        )


# The exchange of one call per peer (the NVSHMEM transport): rank 1 of 4 ranks, 2 per node. In call k every
# rank swaps rows with rank ^ k; each call starts with a team-wide barrier (15 us: the group spans nodes) and
# lasts as long as its slowest pair; what rank j receives is what rank 1 sends to j (a symmetric world).
#   call 1: 0<->1 and 2<->3, every pair on NVLink
#   call 2: 0<->2 and 1<->3, every pair across the NIC
#   call 3: 0<->3 and 1<->2, every pair across the NIC
BARRIERS = 3 * 15e-6


@pytest.mark.parametrize(
    "bytes_to_peer, seconds, nic_seconds, sent, inter",
    [
        # every call waits for its pairs' latency, even with nothing to send: NVLink's in call 1, the NIC's after
        ([0, 0, 0, 0], BARRIERS + 5e-6 + 2 * 15e-6, 2 * 15e-6, 0, 0),
        # every call's slowest pair is the one into rank 2 (940 bytes): over NVLink in call 1, over the NIC
        # (20 ns at 47 GB/s) in calls 2 and 3; rank 1 itself sends 470 + 940
        (
            [470, 99, 940, 0],
            BARRIERS + 5e-6 + 940 / NVLINK + 2 * (15e-6 + 20e-9),
            2 * (15e-6 + 20e-9),
            1410,
            940,
        ),
    ],
)
def test_each_call_of_the_serial_exchange_lasts_its_barrier_and_slowest_pair(
    bytes_to_peer, seconds, nic_seconds, sent, inter
):
    costs = GroupCosts(network_model("h100_ib400", gpus_per_node=2), range(4), 1)
    got = costs.serial_all_to_all(bytes_to_peer)
    assert got.seconds == pytest.approx(seconds, rel=1e-12) and got.nic_seconds == pytest.approx(nic_seconds)
    assert (got.sent_bytes, got.inter_node_bytes) == (sent, inter)


def test_a_serial_exchange_inside_one_node_pays_nvlink_pairs_and_barriers():
    costs = GroupCosts(H100, range(4), 0)  # one node of the 8-GPU preset
    got = costs.serial_all_to_all([0, 3700, 0, 0])
    # each of the 3 calls: a 5 us barrier and its slowest pair, the one into rank 1 (3700 bytes: 10 ns)
    assert got.seconds == pytest.approx(3 * (5e-6 + 5e-6 + 10e-9)) and got.nic_seconds == 0.0


def test_balanced_ep16_over_two_nodes_pays_the_nic_only_in_the_calls_between_nodes():
    """EP=16 over 2 x 8 with balanced routing, ranks paired by XOR: calls 1-7 pair ranks of one node
    (NVLink), calls 8-15 ranks of different nodes (the NIC); every call starts with the 15 us barrier."""
    costs = GroupCosts(H100, range(16), 0)
    got = costs.serial_all_to_all([47_000] * 16)
    assert got.seconds == pytest.approx(15 * 15e-6 + 7 * (5e-6 + 47_000 / NVLINK) + 8 * (15e-6 + 1e-6))
    assert got.nic_seconds == pytest.approx(8 * (15e-6 + 1e-6))


def test_a_free_network_prices_one_call_per_peer_at_nothing_but_counts_its_bytes():
    costs = GroupCosts(network_model("free"), range(16), 0)
    assert costs.serial_all_to_all([64] * 16) == Charge(0.0, 0.0, 15 * 64, 8 * 64)
    calls, own = costs.device_tables("cpu")
    assert calls.shape == (3, 16, 16) and not calls.any() and own.shape == (2, 16) and own.sum() == 15 + 8


def test_the_device_tables_hold_the_pair_of_each_call_and_this_ranks_links():
    costs = GroupCosts(network_model("h100_ib400", gpus_per_node=2), range(4), 1)
    calls, own = costs.device_tables("cpu")
    assert calls[2, 0].tolist() == [0.0] * 4  # no call 0
    assert calls[2, 1].tolist() == [0.0] * 4 and calls[2, 2].tolist() == calls[2, 3].tolist() == [1.0] * 4
    assert calls[0, 1, 1].item() == 5e3 and calls[1, 1, 0].item() == pytest.approx(1 / 370)
    assert calls[0, 3, 1].item() == 15e3 and calls[1, 3, 0].item() == pytest.approx(1 / 47)
    assert own.tolist() == [[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]]
    assert costs.barrier_seconds == pytest.approx(15e-6)


@pytest.mark.parametrize(
    "now, seconds, nic, free, expected",
    [
        (100, 1e-6, 0.0, 5_000, (1_100, 5_000)),  # no NIC: it neither waits nor books it
        (100, 1e-6, 8e-7, 50, (1_100, 900)),  # the NIC is free: it starts now
        (100, 1e-6, 8e-7, 900, (1_900, 1_700)),  # the NIC is busy until 900: it sends after the one before it
    ],
)
def test_collectives_at_the_same_time_share_the_nic_first_come_first_served(now, seconds, nic, free, expected):
    assert nic_queue_end(now, seconds, nic, free) == expected


def test_two_equal_collectives_issued_together_take_twice_the_nic_time():
    first_end, free = nic_queue_end(0, 1e-3, 8e-4, 0)
    second_end, free = nic_queue_end(0, 1e-3, 8e-4, free)
    assert (first_end, second_end, free) == (1_000_000, 1_800_000, 1_600_000)
