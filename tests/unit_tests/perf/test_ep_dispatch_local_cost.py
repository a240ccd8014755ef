"""The dispatcher local-cost script records what it measured, not where it wrote (no GPU needed)."""

from __future__ import annotations

import pytest
from perf_scripts import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("ep_dispatch_local_cost.py")


@pytest.mark.parametrize(
    "argv, kept",
    [
        (["--label", "abc", "--out", "x/y.json", "--mbs", "1"], ["--label", "abc", "--mbs", "1"]),
        (["--out=x/y.json", "--iters", "5"], ["--iters", "5"]),
        (["--mbs", "1", "2"], ["--mbs", "1", "2"]),
    ],
)
def test_recorded_command_leaves_out_the_output_path(script, argv, kept) -> None:
    assert script.measured_argv(argv) == kept


def test_no_op_exchange_hands_back_its_receive_buffer_without_a_group(script) -> None:
    import torch

    exchange = script.NoOpExchange()
    from megatron.bridge.models.torch_native.token_exchange import Route

    route = Route(torch.tensor([2, 2]), torch.tensor([3, 3]), recv_rows=6, source_rows=3)
    out = exchange.exchange([torch.ones(4, 8)], route, lambda recv: recv.clone())
    assert out.shape == (6, exchange._row_bytes) and exchange.world == script.EP


def test_output_digests_follow_the_data_through_the_loopback_and_repeat(script, monkeypatch) -> None:
    """The digests compare commits bit for bit only if real data reaches every output: a change in one
    token's hidden state must change what is received and combined, not the counts."""
    import torch

    gen = torch.Generator().manual_seed(0)
    routing_map, probs = script.random_routing(32, gen, device="cpu")
    peer_map, _ = script.random_routing(32, gen, device="cpu")
    monkeypatch.setattr(script.dist, "all_gather_into_tensor", script.fake_all_gather(peer_map.sum(0).long()))
    x = torch.randn(32, script.HIDDEN, generator=gen).to(torch.bfloat16).requires_grad_(True)
    probs.requires_grad_(True)
    first = script.output_digests(False, x, routing_map, probs)
    assert first["repeatable"] is True
    assert script.output_digests(True, x, routing_map, probs) == first  # the overlap schedule: same bits
    with torch.no_grad():
        x[0] += 1
    changed = script.output_digests(False, x, routing_map, probs)
    assert changed["tokens_per_expert"] == first["tokens_per_expert"]
    assert changed["received_tokens"] != first["received_tokens"] and changed["combined"] != first["combined"]
