"""The EP overlap benchmark's plan and result table, from synthetic run summaries (no GPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from perf_scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("ep_overlap_benchmark.py")


def _summary(step_s: float, losses=(10.0, 9.0, 8.0, 7.0)) -> dict:
    times = [5.0, 1.0, 1.0] + [step_s] * 9
    return {
        "steady_state_window": [4, 12],
        "steady_state_mean_s": step_s,
        "step_times_s": times,
        "tflops_per_gpu": 100.0 / step_s,
        "losses": list(losses),
        "extra": {"gpu_fwd_bwd_s": [0.8 * step_s] * 12, "gpu_optimizer_s": [0.1] * 12, "host_fwd_bwd_s": [0.5] * 12},
        "moe_token_dispatch": [{"description": "sorted dispatcher, sync-free, transport: nvshmem"}],
    }


def test_cases_are_interleaved_larger_micro_batch_first(bench, tmp_path):
    args = bench.parse(["--out", str(tmp_path), "--repeats", "2"])
    jobs = bench.plan_cases(args)
    assert list(jobs) == ["ep1", "nvlink", "host_staged"]
    names = [c.name for c in jobs["nvlink"]]
    assert names == [
        "nvlink_off_mbs2_r0",
        "nvlink_on_mbs2_r0",
        "nvlink_off_mbs1_r0",
        "nvlink_on_mbs1_r0",
        "nvlink_off_mbs2_r1",
        "nvlink_on_mbs2_r1",
        "nvlink_off_mbs1_r1",
        "nvlink_on_mbs1_r1",
    ]
    assert [c.name for c in jobs["ep1"]] == ["ep1_mbs2_r0", "ep1_mbs1_r0", "ep1_mbs2_r1", "ep1_mbs1_r1"]


@pytest.mark.parametrize(
    "dispatch,expected",
    [
        ("auto", []),
        ("sorted", ["model.torch_native_dispatcher=sorted", "model.torch_native_ep_transport=nccl"]),
    ],
)
def test_host_staged_sorted_cases_exchange_tokens_over_nccl(bench, tmp_path, dispatch, expected):
    args = bench.parse(["--out", str(tmp_path), "--ep-dispatch", dispatch])
    case = bench.plan_cases(args)["host_staged"][1]
    argv = bench.harness_argv(case, args)
    assert [a for a in argv if a.startswith("model.torch_native")] == expected
    assert argv[argv.index("--moe_a2a_overlap") + 1] == "true"
    assert bench.TRANSPORT_ENV["host_staged"] == {"NCCL_P2P_DISABLE": "1"}


def test_rows_average_repeats_and_compute_the_hidden_share(bench, tmp_path):
    args = bench.parse(["--out", str(tmp_path), "--transports", "nvlink", "--mbs", "1"])
    jobs = bench.plan_cases(args)
    step = {
        "ep1_mbs1_r0": 0.50,
        "ep1_mbs1_r1": 0.50,
        "nvlink_off_mbs1_r0": 0.70,
        "nvlink_off_mbs1_r1": 0.70,
        "nvlink_on_mbs1_r0": 0.58,
        "nvlink_on_mbs1_r1": 0.62,
    }
    for case in (c for cases in jobs.values() for c in cases):
        case.log_dir.mkdir(parents=True)
        (case.log_dir / "summary.json").write_text(json.dumps(_summary(step[case.name])))
    (row,) = bench.rows(jobs)
    assert row["transport"] == "nvlink" and row["mbs"] == 1
    assert row["ep1_step_s"] == pytest.approx(0.5) and row["off_step_s"] == pytest.approx(0.7)
    assert row["on_step_s"] == pytest.approx(0.6) and row["on_runs_s"] == [0.58, 0.62]
    assert row["hidden_share"] == pytest.approx(0.5)  # (0.7 - 0.6) / (0.7 - 0.5)
    assert row["on_vs_off"] == pytest.approx(0.7 / 0.6) and row["on_vs_ep1"] == pytest.approx(1.2)
    assert row["loss_diff_first4"] == 0.0
    result = dict(date="d", commit="c", device="dev", ceiling_tflops=750.0, window=[4, 12], command="cmd", rows=[row])
    text = bench.markdown_section(result)
    assert "| nvlink | 1 | 0.500 s" in text and "50%" in text and "cmd" in text


@pytest.mark.parametrize(
    "argv, kept",
    [
        (["--out", "o", "--commit", "abc123", "--mbs", "1"], ["--out", "o", "--mbs", "1"]),
        (["--commit=abc123", "--publish"], ["--publish"]),
        (["--transports", "--mbs", "1", "2"], ["--transports", "--mbs", "1", "2"]),
    ],
)
def test_recorded_command_leaves_out_the_measured_commit(bench, argv, kept):
    assert bench.rerun_argv(argv) == kept


def test_one_gpu_run_gives_one_ep1_row_per_micro_batch(bench, tmp_path):
    args = bench.parse(["--out", str(tmp_path), "--transports", "--mbs", "1", "2"])
    jobs = bench.plan_cases(args)
    assert list(jobs) == ["ep1"]
    for case in jobs["ep1"]:
        case.log_dir.mkdir(parents=True)
        (case.log_dir / "summary.json").write_text(json.dumps(_summary(0.4 * case.mbs)))
    rows = bench.rows(jobs)
    assert [(r["transport"], r["mbs"]) for r in rows] == [("ep1", 1), ("ep1", 2)]
    assert rows[0]["ep1_step_s"] == pytest.approx(0.4) and rows[0]["off_step_s"] is None
    text = bench.markdown_section(
        dict(date="d", commit="c", device="dev", ceiling_tflops=None, window=[4, 12], command="cmd", rows=rows)
    )
    assert "| ep1 | 1 | 0.400 s (0.400 / 0.400) | - | - | - | - | - |" in text and "25.3%" in text  # 250 TFLOP/s


@pytest.mark.parametrize(
    "graph,impl,warmup",
    [
        ([], "none", []),
        (["--cuda-graph", "full_iteration"], "full_iteration", ["model.cuda_graph_warmup_steps=2"]),
    ],
)
def test_cuda_graph_option_sets_every_case(bench, tmp_path, graph, impl, warmup):
    args = bench.parse(["--out", str(tmp_path), "--transports", "--mbs", "1", *graph])
    (case, *_) = bench.plan_cases(args)["ep1"]
    argv = bench.harness_argv(case, args)
    assert argv[argv.index("--cuda_graph_impl") + 1] == impl
    assert [a for a in argv if a.startswith("model.cuda_graph")] == warmup
    assert not any(a.startswith("ddp.check_for_nan_in_grad") for a in argv)  # the recipe's check stays on


GRAPHED_SORTED = ["--cuda-graph", "full_iteration", "--ep-dispatch", "sorted", "--mbs", "1", "2"]


@pytest.mark.parametrize(
    "transport,refused_by",
    [
        ("nvlink", None),  # the NVLink target: graph + EP overlap over NVSHMEM, every case accepted
        ("host_staged", "full-iteration-graph-sync-free-moe"),  # NCCL's split sizes go through the host
    ],
)
def test_graphed_sorted_cases_pass_or_fail_validation_before_any_launch(bench, tmp_path, transport, refused_by):
    """Every case is resolved and validated through the harness before a job starts: the graphed
    NVLink cases (overlap off and on) are accepted, the host-staged ones refused by the rule that
    says why, so no GPU time is spent on a run that could not be captured."""
    from megatron.bridge.training.errors import ConfigValidationError

    args = bench.parse(["--out", str(tmp_path), "--transports", transport, *GRAPHED_SORTED])
    cases = bench.plan_cases(args)[transport]
    assert {c.overlap for c in cases} == {False, True}
    if refused_by is None:
        assert all(p.is_file() for p in bench.write_configs(cases, args))
        return
    with pytest.raises(ConfigValidationError) as refused:
        bench.write_configs(cases, args)
    assert [v.rule for v in refused.value.violations] == [refused_by]


def test_a_job_past_its_timeout_is_stopped_with_its_workers_and_reported(bench, tmp_path):
    """A slow job used to end the benchmark with TimeoutExpired, losing every finished case's results;
    now its whole process group is stopped and the status says so."""
    import os
    import time

    script = (
        "import subprocess, sys, time; "
        "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print('worker', w.pid, flush=True); time.sleep(60)"
    )
    start = time.time()
    code = bench.run_logged([sys.executable, "-c", script], dict(os.environ), tmp_path / "job.log", timeout=3)
    assert code == bench.JOB_TIMED_OUT and time.time() - start < 30
    worker = int((tmp_path / "job.log").read_text().split()[1])
    time.sleep(0.5)
    status = Path(f"/proc/{worker}/status")
    assert not status.exists() or "State:\tZ" in status.read_text()  # gone (or a zombie awaiting its reaper)


def test_a_finished_job_returns_its_exit_status(bench, tmp_path):
    import os

    code = bench.run_logged([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ), tmp_path / "j.log", 30)
    assert code == 3


def test_results_are_written_after_every_job_so_a_stopped_run_keeps_what_finished(bench, tmp_path, monkeypatch):
    """results.json used to be written only at the end: a benchmark stopped during its last job (a
    time limit) lost the finished jobs' table."""

    def fake_job(transport, cases, args):
        if transport != "ep1":
            raise KeyboardInterrupt  # stopped during the EP=2 job
        for case in cases:
            case.log_dir.mkdir(parents=True, exist_ok=True)
            (case.log_dir / "summary.json").write_text(json.dumps(_summary(0.4)))
        return 0

    monkeypatch.setattr(bench, "run_job", fake_job)
    monkeypatch.setattr(bench, "matmul_ceiling_tflops", lambda: None)
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--out", str(tmp_path), "--transports", "nvlink", "--mbs", "1", "--commit", "abc"])
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["complete"] is False and result["exit_codes"] == {"ep1": 0}
    assert [(r["transport"], r["mbs"], r["ep1_step_s"], r["off_step_s"]) for r in result["rows"]] == [
        ("nvlink", 1, 0.4, None)
    ]
    assert "**Partial: the run stopped after the jobs ep1 (exit 0).**" in bench.markdown_section(result)
