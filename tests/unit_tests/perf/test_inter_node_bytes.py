"""The inter-node bytes count: what it reads from an emulated run's record, the uniform-routing
expectation beside it, and the reduction against alltoall at the same layout."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from megatron.bridge.perf.benchmarks import inter_node_bytes as count
from megatron.bridge.perf.harness.run import main


def _summary(groups: dict[str, int]) -> dict:
    step = {
        "iteration": 2,
        "groups": {
            g: {"all_to_all": {"inter_node_bytes": b}, "all_gather": {"inter_node_bytes": 7}} for g, b in groups.items()
        },
    }
    return {"emulation": {"steps": [{"iteration": 1, "groups": {}}, step]}}


def test_the_last_steps_all_to_alls_are_counted_by_group():
    counted = count.counted(_summary({"ep[16]": 300, "ep_inter_node[2]": 0}))
    assert counted == {
        "inter_node_bytes_per_layer": 300,
        "by_group": {"ep[16]": 300, "ep_inter_node[2]": 0},
        "iteration": 2,
    }


@pytest.mark.parametrize(
    "dispatcher, nodes, expected",
    [
        ("alltoall", 2, 4.0),  # 8 rows a token, half of the experts on the other node
        ("alltoall", 4, 6.0),
        ("node_aware", 2, 1 - 0.0030959),  # the other node holds none of 8 uniform experts: C(64,8)/C(128,8)
        ("node_aware", 4, 3 * (1 - 0.0927473)),  # C(96,8)/C(128,8) for each of 3 nodes
    ],
)
def test_uniform_routing_expectation(dispatcher, nodes, expected):
    assert count.expected_uniform(dispatcher, nodes) == pytest.approx(expected, abs=1e-4)


def test_rows_give_the_reduction_against_alltoall_at_the_same_layout():
    token_bytes = count.SEQ * count.HIDDEN * 2 * count.EXCHANGES_PER_LAYER
    counts = {
        ("alltoall", 2): {"inter_node_bytes_per_layer": 4 * token_bytes, "by_group": {}},
        ("node_aware", 2): {"inter_node_bytes_per_layer": token_bytes, "by_group": {}},
    }
    rows = {row["dispatcher"]: row for row in count.rows(counts)}
    assert rows["node_aware"]["below_alltoall"] == 4.0 and rows["node_aware"]["token_copies_per_token"] == 1.0
    assert rows["alltoall"]["layout"] == "EP=16 over 2 x 8 (emulated)"


@pytest.mark.parametrize("dispatcher, nodes", [("alltoall", 2), ("node_aware", 4)])
def test_every_count_is_a_command_line_the_harness_accepts(dispatcher, nodes, tmp_path):
    out = io.StringIO()
    assert main([*count.case_argv(dispatcher, nodes, tmp_path, "cpu"), "--dryrun"], out=out) == 0, out.getvalue()
    assert f"EMULATED world of {8 * nodes} GPUs" in out.getvalue()


def test_a_layout_is_counted_as_the_first_rank_of_every_node_and_averaged():
    argvs = [count.case_argv("alltoall", 4, Path("runs"), "cpu", node) for node in range(4)]
    assert [argv[argv.index("--emulate_rank") + 1] for argv in argvs] == ["0", "8", "16", "24"]
    mean = count.averaged(
        [
            {"inter_node_bytes_per_layer": 100, "by_group": {"ep[32]": 100}},
            {"inter_node_bytes_per_layer": 300, "by_group": {"ep[32]": 300}},
        ]
    )
    assert mean["inter_node_bytes_per_layer"] == 200 and mean["by_node"] == [100, 300]
