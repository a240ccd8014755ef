"""The host-operation count of an EP step against EP=1: the cases' command lines and the comparison."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
from perf_scripts import load_script

from megatron.bridge.perf.benchmarks import host_ops
from megatron.bridge.perf.benchmarks.benchmark_jobs import portable_command
from megatron.bridge.perf.harness.argument_parser import parse_args


@pytest.mark.parametrize(
    "arm,expected",
    [
        ("ep1", ["-ng", "1", "-ep", "1", "model.num_moe_experts=8", "train.global_batch_size=4"]),
        ("off", ["-ng", "16", "-gn", "8", "-ep", "16", "--emulate", "train.global_batch_size=64"]),
        ("on", ["--network", "h100_ib400", "comm_overlap.overlap_moe_expert_parallel_comm=true"]),
        ("off_gather", ["comm_overlap.overlap_moe_expert_parallel_comm=false", "model.moe_chunk_sort=gather"]),
        ("on_gather", ["comm_overlap.overlap_moe_expert_parallel_comm=true", "model.moe_chunk_sort=gather"]),
    ],
)
def test_each_case_profiles_one_step_of_the_small_width_layer_on_the_cpu(arm, expected):
    argv = host_ops.HostOpsCase(arm).argv(Path("runs/x"))
    assert all(word in argv for word in expected)
    assert argv[argv.index("-g") + 1] == "cpu" and "--profile" in argv
    assert argv[argv.index("--profile_step_start") + 1] == argv[argv.index("--profile_step_end") + 1] == "3"
    assert set(host_ops.SMALL_WIDTH) <= set(argv)
    parse_args(argv)  # the harness takes it


def test_counts_every_operator_call_of_the_trace_nested_ones_too():
    trace = {
        "traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": "aten::cat", "ts": 0, "dur": 9},
            {"ph": "X", "cat": "cpu_op", "name": "aten::narrow", "ts": 1, "dur": 1},
            {"ph": "X", "cat": "cpu_op", "name": "aten::narrow", "ts": 3, "dur": 1},
            {"ph": "X", "cat": "kernel", "name": "aten::narrow", "ts": 3, "dur": 1},
            {"ph": "i", "cat": "cpu_op", "name": "aten::narrow", "ts": 3},
        ]
    }
    assert host_ops.host_op_counts(trace) == {"aten::cat": 1, "aten::narrow": 2}


def test_the_comparison_gives_calls_per_layer_and_micro_batch_and_what_grew():
    per = host_ops.LAYERS * host_ops.MICRO_BATCHES
    counts = {
        "ep1": collections.Counter({"aten::mm": 10 * per, "aten::narrow": 1 * per}),
        "off": collections.Counter({"aten::mm": 10 * per, "aten::narrow": 101 * per, "_AllToAll": 4 * per}),
    }
    ep1, off = host_ops.compare(counts)
    assert ep1["host_ops_per_layer_microbatch"] == 11 and ep1["vs_ep1"] == 1 and ep1["most_grown_over_ep1"] == []
    assert off["host_ops_per_layer_microbatch"] == 115 and off["vs_ep1"] == round(115 / 11, 3)
    assert [(g["name"], g["per_layer_microbatch"]) for g in off["most_grown_over_ep1"]] == [
        ("aten::narrow", 100),
        ("_AllToAll", 4),
    ]


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--arms", "off,graph"], "--arms: 'graph' is not one of ep1, off, on, off_gather, on_gather"),
        (["--code-root", "no/such/tree"], "--code-root: no/such/tree holds no scripts/performance/run_script.py"),
        (["--compare", "no/such/results.json"], "--compare: no/such/results.json is not a file"),
    ],
)
def test_the_script_refuses_bad_arguments_before_training_anything(argv, says, capsys):
    script = load_script("ep_host_ops.py")
    with pytest.raises(SystemExit) as stop:
        script.parse(argv)
    assert stop.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,command",
    [
        (["--out", "/machine/out", "--publish"], "ep_host_ops.py --out runs/ep_host_ops --publish"),
        (
            ["--code-root", "/machine/tree", "--commit", "abc", "--compare", "/machine/r.json"],
            "--code-root '<checkout of --commit>' --commit abc --compare runs/ep_host_ops_compared/results.json",
        ),
    ],
)
def test_the_recorded_command_names_the_repositorys_folders_not_this_machines(argv, command):
    script = load_script("ep_host_ops.py")
    words = ["uv", "run", "python", "scripts/performance/ep_host_ops.py", *argv]
    recorded = portable_command(words, script.PORTABLE)
    assert command in recorded and "/machine" not in recorded
