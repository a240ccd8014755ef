"""The node-aware MoE dispatcher against megatron-core's alltoall dispatcher on four gloo ranks (CPU,
fp32) playing two "nodes" of two: one ``torch.distributed.run`` launch of
``node_aware_dispatch_driver.py`` runs the dispatchers alone on hand-built routings, a model under
megatron's schedules, and ``pretrain()`` of the tiny recipe at EP=4 (see the driver's docstring)."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("node_aware_dispatch_driver.py")

pytestmark = pytest.mark.functional

CASES = ["random", "idle_experts", "idle_node", "one_node_topk", "top1", "random_one_node", "random_gpu_nodes"]
TWO_NODE_CASES = ["random", "idle_experts", "idle_node", "one_node_topk", "top1"]
SEVERAL_RANKS_PER_NODE = ["random", "idle_experts", "one_node_topk"]
"""Routings where some token has experts on both GPUs of a remote node: one copy per rank (or per
expert) crosses more often than one per node."""


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


@pytest.fixture(scope="module")
def launch(tmp_path_factory, run_on_free_port) -> dict:
    """Every rank's results and the launch's output."""
    out = tmp_path_factory.mktemp("node_aware")

    def args(port: int) -> dict:
        return dict(
            args=[
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc-per-node",
                "4",
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                str(port),
                str(DRIVER),
                str(out),
            ]
        )

    proc = run_on_free_port(args, capture_output=True, text=True, env=_env(), timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    return {"ranks": json.loads((out / "results.json").read_text()), "stdout": proc.stdout}


@pytest.fixture(scope="module")
def ranks(launch) -> list:
    return launch["ranks"]


def _cases(ranks: list, case: str) -> list:
    return [rank["dispatchers"][case] for rank in ranks]


@pytest.mark.parametrize("case", CASES)
def test_the_experts_see_megatrons_rows_and_outputs_and_gradients_agree(ranks, case) -> None:
    """Same rows, probabilities and counts into the experts; the outputs and the gradients of the
    hidden states, probabilities and expert weights agree to fp32 rounding (only the order in which a
    token's expert rows are summed differs: per node first)."""
    for report in _cases(ranks, case):
        assert report["same_expert_inputs"]
        megatron_counts, node_aware_counts = report["tokens_per_expert"]
        assert node_aware_counts == megatron_counts
        for key, diff in report["diff"].items():
            assert diff <= 1e-6 * max(1.0, report["scale"][key]), (key, diff, report["scale"][key])


def test_the_routings_hold_the_edge_cases_they_are_named_for(ranks) -> None:
    idle_experts = [counts for r in _cases(ranks, "idle_experts") for counts in r["tokens_per_expert"][1]]
    assert 0 in idle_experts  # experts 1 and 5 receive no token
    idle_node = [r["tokens_per_expert"][1] for r in _cases(ranks, "idle_node")]
    assert idle_node[2] == idle_node[3] == [0, 0]  # node 1 (ranks 2, 3) receives nothing
    assert sum(r["traffic"]["node_aware"]["rows"].get("combine", 0) for r in _cases(ranks, "idle_node")[2:]) == 0
    for case in SEVERAL_RANKS_PER_NODE:
        pairs = [r["pairs"] for r in _cases(ranks, case)]
        assert sum(p["token_rank"] for p in pairs) > sum(p["token_node"] for p in pairs), case


def sends_one_row_per_token_and_node(reports: list, dispatcher: str) -> bool:
    """Whether ``dispatcher`` sent each rank's tokens across nodes exactly once per (token, remote
    node) pair in the dispatch, and returned as many rows in all in the combine."""
    pairs = [r["pairs"]["token_node"] for r in reports]
    rows = [r["traffic"][dispatcher]["rows"] for r in reports]
    dispatched = [row.get("dispatch", 0) for row in rows]
    combined = sum(row.get("combine", 0) for row in rows)
    return dispatched == pairs and combined == sum(pairs)


@pytest.mark.parametrize("case", CASES)
def test_node_aware_inter_node_rows_are_the_unique_token_node_pairs(ranks, case) -> None:
    assert sends_one_row_per_token_and_node(_cases(ranks, case), "node_aware")


@pytest.mark.parametrize("case", SEVERAL_RANKS_PER_NODE)
@pytest.mark.parametrize("dispatcher,pairs", [("per_rank", "token_rank"), ("megatron", "token_expert")])
def test_the_row_count_fails_a_dispatcher_that_sends_a_copy_per_rank_or_expert(ranks, case, dispatcher, pairs) -> None:
    """The check above on a dispatcher that sends one copy per destination rank (the node-aware one
    told each GPU is a node) and on megatron's (one per remote expert): in these routings both send
    more rows than there are (token, node) pairs, and the check does not hold."""
    reports = _cases(ranks, case)
    assert not sends_one_row_per_token_and_node(reports, dispatcher)
    assert [r["traffic"][dispatcher]["rows"].get("dispatch", 0) for r in reports] == [
        r["pairs"][pairs] for r in reports
    ]


@pytest.mark.parametrize("case", SEVERAL_RANKS_PER_NODE)
def test_fewer_inter_node_bytes_than_megatron_where_tokens_share_a_node(ranks, case) -> None:
    """All inter-node bytes (hidden rows, probabilities, expert slots) of dispatch and combine."""
    reports = _cases(ranks, case)
    total = {
        kind: sum(sum(r["traffic"][kind]["bytes"].values()) for r in reports) for kind in ("megatron", "node_aware")
    }
    assert total["node_aware"] < total["megatron"], total


@pytest.mark.parametrize("variant", ["node_aware", "node_aware_overlap", "node_aware_overlap_delay_wgrad"])
def test_trains_as_megatrons_dispatcher_under_each_schedule(ranks, variant) -> None:
    """Standard 1F1B, the combined-1F1B EP-overlap schedule, and that with delayed expert wgrad."""
    for rank in ranks:
        got, ref = rank["schedules"][variant], rank["schedules"]["megatron"]
        assert got["node_aware_layers"] == 2 and ref["node_aware_layers"] == 0
        assert got["losses"] == pytest.approx(ref["losses"], rel=1e-6)
        assert got["same_grad_names"] and got["grad_diff"] <= 1e-6 * got["grad_scale"]
        assert got["deferred_wgrads_left"] == 0


def test_pretrain_with_the_node_aware_dispatcher_matches_the_alltoall_losses(launch) -> None:
    losses = launch["ranks"][0]["pretrain"]
    assert len(losses["node_aware"]) == 3 and all(math.isfinite(x) for x in losses["node_aware"])
    assert losses["node_aware"] == pytest.approx(losses["megatron"], abs=1e-4)
    assert "node-aware dispatcher" in launch["stdout"] and "2 nodes x 2 GPUs" in launch["stdout"]
