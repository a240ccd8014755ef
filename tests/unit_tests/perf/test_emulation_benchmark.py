"""The emulation benchmark's plan and results: the cases it builds through the harness, the rows and
hidden shares it writes, and the merge of runs made in separate calls."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from perf_scripts import load_script
from trace_events import kernel, step

from megatron.bridge.perf.benchmarks import emulation_benchmark as bench
from megatron.bridge.perf.benchmarks.benchmark_jobs import cpu_model, host_facts, write_configs
from megatron.bridge.perf.harness.run import main
from megatron.bridge.training.config_stages.facts.graph_capture import ALLOCATOR_VARS


def test_the_plan_interleaves_repeats_and_runs_free_once_per_dispatcher():
    jobs = bench.plan(["h100_ib400", "h200_ib400"], ["alltoall"], repeats=2, layers=4, nodes=2, steps=12, gpu="h200")
    names = [case.name for case in jobs["emulated"]]
    assert names[:3] == [
        "free_free_alltoall_ep16_r1",
        "off_h100_ib400_alltoall_ep16_r1",
        "on_h100_ib400_alltoall_ep16_r1",
    ]
    assert names.count("free_free_alltoall_ep16_r1") == 1 and len(names) == 2 * (1 + 2 * 3)
    assert [case.name for case in jobs["ep1"]] == ["ep1_none_none_ep16_r1", "ep1_none_none_ep16_r2"]


def test_profiled_cases_run_after_the_timed_ones_and_ep1_only_where_it_does_the_same_work():
    jobs = bench.plan(
        ["h100_ib400"], ["node_aware"], repeats=1, layers=4, nodes=2, steps=12, gpu="h200", profile_arms=["ep1", "on"]
    )
    assert [c.name for c in jobs["emulated"]][-1] == "on_h100_ib400_node_aware_ep16_prof"
    assert [c.name for c in jobs["ep1"]] == ["ep1_none_none_ep16_r1", "ep1_none_none_ep16_prof"]
    four_nodes = bench.plan(
        ["h100_ib400"], ["alltoall"], repeats=1, layers=4, nodes=4, steps=12, gpu="h200", profile_arms=["ep1"]
    )
    assert "ep1" not in four_nodes  # 4 experts a GPU cannot take top-8: free is the reference there


def test_a_graphed_dispatcher_brings_a_graphed_ep1_reference():
    jobs = bench.plan(
        ["h100_ib400"], ["sorted_nvshmem", "sorted_nvshmem_graph"], repeats=1, layers=4, nodes=2, steps=12, gpu="h200"
    )
    assert [c.name for c in jobs["ep1"]] == ["ep1_none_none_ep16_r1", "ep1_none_graph_ep16_r1"]
    eager, graphed = (c.argv(Path("runs")) for c in jobs["ep1"])
    assert (_last_value(eager, "--cuda_graph_impl"), _last_value(graphed, "--cuda_graph_impl")) == (
        "none",
        "full_iteration",
    )


def test_micro_batches_set_the_global_batch_and_the_row():
    jobs = bench.plan(
        ["h100_ib400"],
        ["sorted_nvshmem_graph"],
        repeats=1,
        layers=4,
        nodes=2,
        steps=12,
        gpu="h200",
        arms=["ep1", "on"],
        micro_batches=16,
    )
    ep1, on = jobs["ep1"][0], jobs["emulated"][0]
    assert on.name == "on_h100_ib400_sorted_nvshmem_graph_ep16_mb16_r1" and on.key[2] == 16
    assert "train.global_batch_size=16" in ep1.argv(Path("runs"))
    assert "train.global_batch_size=256" in on.argv(Path("runs"))  # 16 micro-batches on each of 16 ranks


def _last_value(argv: list[str], flag: str) -> str:
    """What the harness reads for ``flag`` (the last one given wins)."""
    return argv[len(argv) - argv[::-1].index(flag)]


@pytest.mark.parametrize(
    "arm, dispatcher, nodes, profile",
    [
        ("ep1", "sorted", 2, False),
        ("free", "sorted", 2, False),
        ("on_delay_wgrad", "sorted", 2, False),
        ("on", "node_aware", 2, True),
        ("off", "node_aware", 4, False),
        ("on", "alltoall", 4, False),
        ("ep1", "graph", 2, False),
        ("on", "sorted_nvshmem_graph", 2, False),
    ],
)
def test_every_case_is_a_command_line_the_harness_accepts(arm, dispatcher, nodes, profile, tmp_path):
    case = bench.Case(arm, "h100_ib400", dispatcher, 1, 4, nodes, 12, "h200", profile)
    out = io.StringIO()
    assert main([*case.argv(tmp_path), "--dryrun"], out=out) == 0, out.getvalue()
    assert (f"EMULATED world of {8 * nodes} GPUs" in out.getvalue()) == (arm != "ep1")


@pytest.fixture
def no_allocator_vars(monkeypatch):
    """The launching environment without torch's allocator variables (a test sets the ones it needs)."""
    for name in ALLOCATOR_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    "dispatcher, users_env, launched_with",
    [
        ("sorted_nvshmem_graph_budget", {}, "expandable_segments:True"),
        ("alltoall", {}, None),
        ("sorted_nvshmem_graph_budget", {"PYTORCH_ALLOC_CONF": "max_split_size_mb:512"}, None),
        ("sorted_nvshmem_graph_budget", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}, None),
    ],
    ids=["graphed", "eager", "users-torch-variable", "users-cuda-variable"],
)
def test_a_graphed_run_launches_with_expandable_segments_unless_the_user_set_the_allocator(
    dispatcher, users_env, launched_with, tmp_path, monkeypatch, no_allocator_vars
):
    for name, value in users_env.items():
        monkeypatch.setenv(name, value)
    case = bench.Case("on", "h100_ib400", dispatcher, 1, 4, 2, 12, "h200")
    _, env = write_configs([case.argv(tmp_path)])
    assert env.get("PYTORCH_CUDA_ALLOC_CONF") == launched_with
    out = io.StringIO()
    assert main([*case.argv(tmp_path / "dry"), "--dryrun"], out=out) == 0, out.getvalue()
    assert ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in out.getvalue()) == (launched_with is not None)


def test_a_sweep_from_eager_to_graphed_launches_every_value_with_the_same_allocator(tmp_path, no_allocator_vars):
    argv = bench.Case("on", "h100_ib400", "sorted_nvshmem_graph_budget", 1, 4, 2, 12, "h200").argv(tmp_path)
    out = io.StringIO()
    code = main([*argv, "--dryrun", "--sweep", "model.cuda_graph_impl=none,full_iteration"], out=out)
    launches = [line for line in out.getvalue().splitlines() if "loopback_torchrun" in line]
    assert code == 0 and len(launches) == 2, out.getvalue()
    assert all("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in line for line in launches)


def _row(arm: str, network: str, steps: list[float], ep: int = 16, layers: int = 4) -> dict:
    return {
        "ep": ep,
        "layers": layers,
        "network": network,
        "dispatcher": "alltoall",
        "arm": arm,
        "step_s": steps,
        "tflops_per_gpu": 100.0,
        "commit": "c",
    }


def test_the_hidden_share_is_what_overlap_took_off_what_communication_added():
    table = [_row("free", "free", [1.0]), _row("off", "h100_ib400", [1.5]), _row("on", "h100_ib400", [1.1])]
    bench._add_hidden_shares(table)
    assert table[2]["hidden_share"] == pytest.approx(0.8)


def test_runs_of_separate_calls_merge_their_repeats_side_by_side():
    first = [_row("free", "free", [1.0]), _row("off", "h100_ib400", [1.5]), _row("on", "h100_ib400", [1.6])]
    second = [_row("free", "free", [1.2]), _row("off", "h100_ib400", [1.7]), _row("on", "h100_ib400", [1.6])]
    merged = {row["arm"]: row for row in bench.merge_rows([first, second], ["abc"] * 2)}
    assert merged["off"]["step_s"] == [1.5, 1.7] and merged["on"]["commit"] == "abc"
    assert merged["on"]["hidden_share"] == pytest.approx((1.6 - 1.6) / (1.6 - 1.1))


def test_layouts_of_different_ep_sizes_stay_apart_in_a_merge():
    ep16 = [_row("free", "free", [1.0]), _row("off", "h100_ib400", [1.5]), _row("on", "h100_ib400", [1.1])]
    ep32 = [_row("free", "free", [2.0], 32), _row("off", "h100_ib400", [3.0], 32), _row("on", "h100_ib400", [2.5], 32)]
    merged = {(row["ep"], row["arm"]): row for row in bench.merge_rows([ep16, ep32], ["abc"] * 2)}
    assert merged[(16, "on")]["hidden_share"] == pytest.approx(0.8)
    assert merged[(32, "on")]["hidden_share"] == pytest.approx(0.5)


def test_depths_stay_apart_in_a_merge_and_a_row_without_a_depth_is_four_layers_deep():
    shallow = [_row("free", "free", [1.0]), _row("off", "h100_ib400", [1.5]), _row("on", "h100_ib400", [1.1])]
    for row in shallow:
        row.pop("layers")
    deep = [_row("off", "h100_ib400", [12.0], layers=48), _row("on", "h100_ib400", [9.0], layers=48)]
    merged = {(row.get("layers", 4), row["arm"]): row for row in bench.merge_rows([shallow, deep], ["abc"] * 2)}
    assert merged[(4, "off")]["step_s"] == [1.5] and merged[(48, "off")]["step_s"] == [12.0]
    assert merged[(4, "on")]["hidden_share"] == pytest.approx(0.8) and "hidden_share" not in merged[(48, "on")]


def test_a_row_keeps_the_highest_peak_memory_of_its_repeats():
    cases = [bench.Case("off", "h100_ib400", "alltoall", repeat, 4, 2, 8, "h100") for repeat in (1, 2)]
    summaries = [{"step_times_s": [9.0, 1.0, 1.0, 1.0], "peak_memory_gib": gib} for gib in (61.5, 63.25)]
    results = {case.name: bench.case_result(case, summary, 2) for case, summary in zip(cases, summaries)}
    (row,) = bench.rows(cases, results, "abc", 2)
    assert row["step_s"] == [1.0, 1.0] and row["peak_memory_gib"] == 63.25


@pytest.mark.parametrize(
    "steps, window_start, timed",
    [(5, 3, [1.5]), (4, 4, [])],
    ids=["window-before-the-profiled-step", "window-starts-at-the-profiled-step"],
)
def test_a_profiled_case_traces_its_last_step_and_times_the_window_before_it(tmp_path, steps, window_start, timed):
    case = bench.Case("on", "h100_ib400", "alltoall", 0, 48, 2, steps, "h100", profile=True)
    argv = case.argv(tmp_path)
    assert argv[argv.index("--profile_step_start") + 1] == argv[argv.index("--profile_step_end") + 1] == str(steps)
    trace = tmp_path / "profile" / f"trace_rank0_steps{steps}-{steps}.json"
    trace.parent.mkdir()
    trace.write_text(json.dumps({"traceEvents": [step(steps, 0, 1000), kernel("gemm", 0, 600, 7)]}))
    summary = {"step_times_s": [9.0, 9.0, 1.0, 2.0, 7.0][:steps]}
    result = bench.case_result(case, summary, window_start, tmp_path)
    assert result["profile"]["gpu_idle_ms"] == pytest.approx(0.4)
    table = bench.rows([case], {case.name: result}, "abc", 2)
    assert [(row["step_s"], row["profile"]["step_ms"]) for row in table] == ([(timed, 1.0)] if timed else [])


def test_a_merge_keeps_the_highest_peak_memory_and_adds_none_where_no_run_had_one():
    measured = [{**_row("off", "h100_ib400", [1.5]), "peak_memory_gib": 70.0}]
    again = [{**_row("off", "h100_ib400", [1.6]), "peak_memory_gib": 71.0}]
    (row,) = bench.merge_rows([measured, again], ["abc"] * 2)
    assert row["peak_memory_gib"] == 71.0
    (old,) = bench.merge_rows([[_row("off", "h100_ib400", [1.5])]], ["abc"])
    assert "peak_memory_gib" not in old


@pytest.mark.parametrize(
    "cpuinfo, expected",
    [
        ("processor\t: 0\nmodel name\t: Example CPU 9000 @ 3.0GHz\nflags\t: sse\n", "Example CPU 9000 @ 3.0GHz"),
        ("processor\t: 0\nmodel name\t: First\nprocessor\t: 1\nmodel name\t: Second\n", "First"),
        ("processor\t: 0\nmodel name\t:\n", None),
        (None, None),
    ],
    ids=["one-model-name", "first-of-several", "empty-name", "no-cpuinfo"],
)
def test_the_host_is_named_by_its_cpu_model(cpuinfo, expected, tmp_path, monkeypatch):
    monkeypatch.setattr("platform.processor", lambda: "")
    path = tmp_path / "cpuinfo"
    if cpuinfo is not None:
        path.write_text(cpuinfo)
    assert cpu_model(path) == (expected or "unknown")


def test_the_host_facts_time_one_small_eager_call(tmp_path):
    (tmp_path / "cpuinfo").write_text("model name\t: Example CPU\n")
    facts = host_facts(tmp_path / "cpuinfo", probe_calls=50)
    assert set(facts) == {"cpu", "logical_cpus", "torch_op_us"}
    assert facts["cpu"] == "Example CPU" and facts["torch_op_us"] > 0


def _results(path, network: str, rows: list[dict], layers: int = 4) -> Path:
    meta = {
        "question": "q",
        "modeled": "m",
        "layers": layers,
        "steps": 12,
        "window_start": 4,
        "networks": {network: {"name": network}},
        "command": f"python x.py --out /machine/dir --networks {network}",
        "device": "1 x GPU",
        "matmul_ceiling_tflops": 700.0,
    }
    path.write_text(json.dumps({**meta, "rows": rows}))
    return path


def test_the_merge_script_keeps_every_network_depth_and_note_of_its_calls(tmp_path):
    script = load_script("ep_emulation_benchmark.py")
    first = _results(tmp_path / "a.json", "h100_ib400", [_row("off", "h100_ib400", [1.5])])
    second = _results(tmp_path / "b.json", "h200_ib400", [_row("off", "h200_ib400", [9.0], layers=48)], layers=48)
    argv = [
        "--merge",
        str(first),
        str(second),
        "--out",
        str(tmp_path / "out"),
        "--ran-at",
        "abc",
        "--note",
        "the first call ran under a sampler",
    ]
    with contextlib.redirect_stdout(io.StringIO()):
        assert script.main(argv) == 0
    merged = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(merged["networks"]) == {"h100_ib400", "h200_ib400"} and merged["layers"] == [4, 48]
    assert merged["notes"] == ["the first call ran under a sampler"] and merged["ran_at"] == "abc"
    assert all("/machine/dir" not in command for command in merged["commands"])
    assert "hosts" not in merged  # runs made before results named their host


@pytest.mark.parametrize(
    "ran_at, commits, recorded",
    [
        ([], {"off": "c", "on": "c"}, None),  # the rows keep what they recorded (_row: "c")
        (["c1"], {"off": "c1", "on": "c1"}, "c1"),
        (["a.json=c1", "b.json=c2"], {"off": "c1", "on": "c2"}, {"a.json": "c1", "b.json": "c2"}),
        (["c0", "b.json=c2"], {"off": "c0", "on": "c2"}, {"a.json": "c0", "b.json": "c2"}),
    ],
    ids=["none", "every-run", "one-per-run", "default-and-one-run"],
)
def test_the_merge_script_names_the_commit_each_run_ran(tmp_path, ran_at, commits, recorded):
    script = load_script("ep_emulation_benchmark.py")
    first = _results(tmp_path / "a.json", "h100_ib400", [_row("off", "h100_ib400", [1.5])])
    second = _results(tmp_path / "b.json", "h100_ib400", [_row("on", "h100_ib400", [1.2])])
    argv = ["--merge", str(first), str(second), "--out", str(tmp_path / "out"), *(f"--ran-at={c}" for c in ran_at)]
    with contextlib.redirect_stdout(io.StringIO()):
        assert script.main(argv) == 0
    merged = json.loads((tmp_path / "out" / "results.json").read_text())
    assert {row["arm"]: row["commit"] for row in merged["rows"]} == commits and merged["ran_at"] == recorded
    assert all(f"--ran-at={c}" in merged["merged_by"] for c in ran_at)


def test_the_merge_script_refuses_runs_of_one_row_at_two_commits(tmp_path, capsys):
    script = load_script("ep_emulation_benchmark.py")
    first = _results(tmp_path / "a.json", "h100_ib400", [_row("off", "h100_ib400", [1.5])])
    second = _results(tmp_path / "b.json", "h100_ib400", [_row("off", "h100_ib400", [1.6])])
    argv = ["--merge", str(first), str(second), "--out", str(tmp_path / "out"), "--ran-at", "b.json=c2"]
    assert script.main(argv) == 2
    message = capsys.readouterr().err
    assert "arm off) has runs at c and at c2" in message and "Fix:" in message
    assert not (tmp_path / "out").exists()


def test_the_merge_script_refuses_a_commit_for_a_file_it_does_not_merge(tmp_path, capsys):
    script = load_script("ep_emulation_benchmark.py")
    first = _results(tmp_path / "a.json", "h100_ib400", [_row("off", "h100_ib400", [1.5])])
    argv = ["--merge", str(first), "--out", str(tmp_path / "out"), "--ran-at", "c.json=c1"]
    assert script.main(argv) == 2
    assert "c.json is not one of the merged files" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_merge_script_keeps_the_host_of_each_call(tmp_path):
    script = load_script("ep_emulation_benchmark.py")
    paths = []
    for name, cpu in (("a.json", "Fast CPU"), ("b.json", "Slow CPU")):
        path = _results(tmp_path / name, "h100_ib400", [_row("off", "h100_ib400", [1.5])])
        run = json.loads(path.read_text())
        path.write_text(json.dumps({**run, "host": {"cpu": cpu, "logical_cpus": 16, "torch_op_us": 1.0}}))
        paths.append(str(path))
    with contextlib.redirect_stdout(io.StringIO()):
        assert script.main(["--merge", *paths, "--out", str(tmp_path / "out")]) == 0
    merged = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [host["cpu"] for host in merged["hosts"]] == ["Fast CPU", "Slow CPU"]


def _results_on(path, device: str, steps: float) -> str:
    results = _results(path, "h100_ib400", [_row("off", "h100_ib400", [steps])])
    results.write_text(json.dumps({**json.loads(results.read_text()), "device": device}))
    return str(results)


def test_each_merged_row_names_the_gpu_its_runs_ran_on(tmp_path):
    """The published rows are compared across machines on the benchmark page: each says its GPU."""
    script = load_script("ep_emulation_benchmark.py")
    paths = [
        _results_on(tmp_path / name, "1 x NVIDIA H200", steps) for name, steps in (("a.json", 1.5), ("b.json", 1.6))
    ]
    with contextlib.redirect_stdout(io.StringIO()):
        assert script.main(["--merge", *paths, "--out", str(tmp_path / "out")]) == 0
    (row,) = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    assert row["device"] == "1 x NVIDIA H200" and row["step_s"] == [1.5, 1.6]


def test_runs_of_one_row_on_different_gpus_are_refused_as_repeats(tmp_path):
    script = load_script("ep_emulation_benchmark.py")
    paths = [
        _results_on(tmp_path / "a.json", "1 x NVIDIA H100 80GB HBM3", 1.5),
        _results_on(tmp_path / "b.json", "1 x NVIDIA H200", 1.4),
    ]
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert script.main(["--merge", *paths, "--out", str(tmp_path / "out")]) == 2
    message = err.getvalue()
    assert "1 x NVIDIA H100 80GB HBM3" in message and "1 x NVIDIA H200" in message and "arm off" in message
    assert "Fix:" in message and not (tmp_path / "out" / "results.json").exists()


def test_a_row_written_before_rows_named_their_gpu_takes_the_first_gpu_named_and_refuses_a_second():
    unnamed = [_row("off", "h100_ib400", [1.5])]
    (row,) = bench.merge_rows([unnamed, [_row("off", "h100_ib400", [1.6])]], ["abc"] * 2, [None, "1 x NVIDIA H200"])
    assert row["device"] == "1 x NVIDIA H200" and row["step_s"] == [1.5, 1.6]
    with pytest.raises(bench.MixedDevicesError):
        bench.merge_rows(
            [unnamed, unnamed, unnamed], ["abc"] * 3, [None, "1 x NVIDIA H200", "1 x NVIDIA H100 80GB HBM3"]
        )


def test_a_run_names_its_gpu_in_every_row():
    cases = [bench.Case("off", "h100_ib400", "alltoall", 1, 4, 2, 8, "h100")]
    results = {cases[0].name: bench.case_result(cases[0], {"step_times_s": [9.0, 1.0, 1.0]}, 2)}
    (row,) = bench.rows(cases, results, "abc", 2, "1 x NVIDIA H100 80GB HBM3")
    assert row["device"] == "1 x NVIDIA H100 80GB HBM3"


def test_the_merge_leaves_out_one_runs_rows_of_a_dispatcher_and_says_so(tmp_path):
    script = load_script("ep_emulation_benchmark.py")
    stale = {**_row("off", "h100_ib400", [1.0]), "dispatcher": "node_aware"}
    first = _results(tmp_path / "a.json", "h100_ib400", [_row("off", "h100_ib400", [1.5]), stale])
    redone = {**_row("off", "h100_ib400", [2.0]), "dispatcher": "node_aware"}
    second = _results(tmp_path / "b.json", "h100_ib400", [redone])
    argv = ["--merge", str(first), str(second), "--out", str(tmp_path / "out"), "--leave-out", "a.json:node_aware"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert script.main(argv) == 0
    merged = json.loads((tmp_path / "out" / "results.json").read_text())
    steps = {row["dispatcher"]: row["step_s"] for row in merged["rows"]}
    assert steps == {"alltoall": [1.5], "node_aware": [2.0]}
    assert merged["notes"] == ["left out: a.json:node_aware"] and "--leave-out=a.json:node_aware" in merged["merged_by"]


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        ({"dispatch_combine_ms": 4000.0, "dispatch_combine_exposed_ms": 1000.0}, 0.75),
        ({"dispatch_combine_ms": 4000.0, "dispatch_combine_exposed_ms": 4000.0}, 0.0),
        ({"dispatch_combine_ms": 0.0, "dispatch_combine_exposed_ms": 0.0}, None),
        ({"step_ms": 10.0}, None),
    ],
)
def test_hidden_by_trace_is_the_share_of_dispatch_and_combine_beside_compute(profile, expected):
    assert bench.hidden_by_trace(profile) == (pytest.approx(expected) if expected is not None else None)


def test_a_profiled_row_carries_hidden_by_trace_through_a_merge_and_an_unprofiled_one_none():
    on = _row("on", "h100_ib400", [1.1])
    on["profile"] = {"dispatch_combine_ms": 400.0, "dispatch_combine_exposed_ms": 100.0}
    on["hidden_by_trace"] = 0.1  # a stale figure from an older reading is recomputed, not kept
    table = [_row("free", "free", [1.0]), _row("off", "h100_ib400", [1.5]), on]
    merged = {row["arm"]: row for row in bench.merge_rows([table], ["abc"])}
    assert merged["on"]["hidden_by_trace"] == pytest.approx(0.75)
    assert merged["on"]["hidden_share"] == pytest.approx(0.8)
    assert "hidden_by_trace" not in merged["off"]


@pytest.mark.parametrize("cut_short", [True, False], ids=["cut-while-reading-a-trace", "every-case-read"])
def test_a_call_keeps_the_rows_it_timed_when_it_is_cut_short_reading_a_trace(tmp_path, monkeypatch, cut_short):
    script = load_script("ep_emulation_benchmark.py")
    monkeypatch.setattr(script, "matmul_ceiling_tflops", lambda: None)
    monkeypatch.setattr(script, "host_facts", lambda: {"cpu": "described"})
    monkeypatch.setattr(script, "device_name", lambda: "1 x described GPU")
    monkeypatch.setattr(
        script, "run_job", lambda name, cases, out, timeout: {c.name: {"step_times_s": [3.0, 2.0, 1.0]} for c in cases}
    )
    read = bench.case_result

    def case_result(case, summary, window_start, run_dir=None):
        if case.profile and cut_short:
            raise KeyboardInterrupt  # the call's time runs out while the trace is read
        return read(case, summary, window_start, run_dir)

    monkeypatch.setattr(bench, "case_result", case_result)
    argv = ["--out", str(tmp_path), "--networks", "h100_ib400", "--dispatchers", "alltoall", "--arms", "free,off,on"]
    argv += ["--profile-arms", "on", "--repeats", "1", "--steps", "3", "--window-start", "2", "--gpu", "h100"]
    with contextlib.redirect_stdout(io.StringIO()):
        if cut_short:
            with pytest.raises(KeyboardInterrupt):
                script.main(argv)
        else:
            assert script.main(argv) == 0
    written = json.loads((tmp_path / "results.json").read_text())
    assert {row["arm"]: row["step_s"] for row in written["rows"]} == {
        "free": [1.5],
        "off": [1.5],
        "on": [1.5] if cut_short else [1.5, 2.0],  # the profiled case times step 2, before its traced step 3
    }
    assert written["complete"] is not cut_short
