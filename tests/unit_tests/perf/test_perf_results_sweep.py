"""Steady-state results table and sweep outputs (markdown + bar chart)."""

import pytest

from megatron.bridge.perf.harness.results import format_results, steady_state, summary_steady_state
from megatron.bridge.perf.harness.sweep import (
    SweepPoint,
    job_dirname,
    parse_sweep,
    split_values,
    sweep_markdown,
    write_sweep_outputs,
)

TIMES = [9.0, 2.0, 1.0, 1.2, 0.8, 1.0, 1.1, 0.9, 5.0]


def test_steady_state_window_3_to_8():
    ss = steady_state(TIMES, (3, 8))
    assert (ss.first, ss.last, ss.count) == (3, 8, 6)
    assert ss.mean_s == pytest.approx(1.0) and ss.min_s == 0.8 and ss.max_s == 1.2


def test_steady_state_clipped_and_empty():
    assert steady_state([1.0, 2.0, 3.0, 4.0], (3, 8)).count == 2
    assert steady_state([1.0], (3, 8)) is None


def test_summary_values_used_when_window_matches_else_recomputed():
    summary = {
        "step_times_s": TIMES,
        "steady_state_window": [3, 8],
        "steady_state_mean_s": 7.0,
        "steady_state_min_s": 6.0,
        "steady_state_max_s": 8.0,
    }
    assert summary_steady_state(summary).mean_s == 7.0
    assert summary_steady_state(summary, [2, 3]).mean_s == pytest.approx(1.5)


def test_format_results_table(tmp_path):
    summary = {
        "step_times_s": TIMES,
        "steady_state_window": [3, 8],
        "tokens_per_s": 12345.6,
        "tflops_per_gpu": 123.45,
        "peak_memory_gib": 10.5,
        "world_size": 2,
        "losses": [3.0, 2.5],
    }
    text = format_results(summary, tmp_path / "summary.json")
    for piece in (
        "iterations 3-8",
        "1.0000 s",
        "0.8000 s",
        "1.2000 s",
        "12,346",
        "123.5",
        "10.50 GiB",
        "summary.json",
        "2.5000",
    ):
        assert piece in text


def test_format_results_short_run():
    assert "only 0 iterations ran" in format_results({"step_times_s": []}, "x")


@pytest.mark.parametrize(
    "text, key, values",
    [
        (
            "comm_overlap.overlap_moe_expert_parallel_comm=false,true",
            "comm_overlap.overlap_moe_expert_parallel_comm",
            ("false", "true"),
        ),
        ("model.seq_length=1024, 2048 ,4096", "model.seq_length", ("1024", "2048", "4096")),
        ("logger.steady_state_window=[3,8],[2,4]", "logger.steady_state_window", ("[3,8]", "[2,4]")),
    ],
)
def test_parse_sweep(text, key, values):
    spec = parse_sweep(text)
    assert spec.key == key and spec.values == values


@pytest.mark.parametrize("text", ["nokey", "a=1,2", "a.b=1", "a.b=1,1", "a.b=1,,2", "a.b="])
def test_parse_sweep_rejects(text):
    with pytest.raises(ValueError):
        parse_sweep(text)


def test_split_values_keeps_quotes():
    assert split_values("'a,b',c") == ["'a,b'", "c"]


def test_job_dirname_is_safe_and_ordered():
    spec = parse_sweep("model.x=[1, 2],a/b")
    assert job_dirname(spec, 0, "[1, 2]") == "00_x=1_2"
    assert "/" not in job_dirname(spec, 1, "a/b")


def _points():
    from megatron.bridge.perf.harness.results import SteadyState

    return [
        SweepPoint("false", "runs/a", SteadyState(3, 8, 2.0, 1.8, 2.2, 6)),
        SweepPoint("true", "runs/b", SteadyState(3, 8, 1.6, 1.5, 1.7, 6)),
        SweepPoint("maybe", "runs/c", None, exit_code=1),
    ]


def test_sweep_markdown_speedup_and_failure():
    spec = parse_sweep("comm_overlap.overlap_moe_expert_parallel_comm=false,true,maybe")
    md = sweep_markdown(spec, _points(), "cmd --sweep x")
    assert "| `false` | 2.0000 | 1.8000 | 2.2000 | 1.000x |" in md
    assert "| `true` | 1.6000 | 1.5000 | 1.7000 | 1.250x |" in md
    assert "failed (exit 1)" in md and "cmd --sweep x" in md and "iterations 3-8" in md


def test_sweep_outputs_written(tmp_path):
    spec = parse_sweep("comm_overlap.overlap_moe_expert_parallel_comm=false,true,maybe")
    md, png = write_sweep_outputs(spec, _points(), tmp_path)
    assert md.read_text().startswith("# Sweep")
    assert png is not None and png.read_bytes()[:4] == b"\x89PNG"
