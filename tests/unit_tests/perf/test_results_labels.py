"""The end-of-run Results table says what its numbers are: a CPU smoke-mode run's throughput is no
GPU figure, an emulated run's times are modeled on a named network and its tokens/s is the whole
world's, projected from one process; the steady-state window says how it was chosen."""

from __future__ import annotations

import re

import pytest

from megatron.bridge.perf.harness.results import format_results

STEPS = 10
TIMES = [2.0, 1.5] + [1.0] * (STEPS - 2)


def _summary(device: str, emulated: bool) -> dict:
    summary = {
        "step_times_s": TIMES,
        "losses": [7.0] * STEPS,
        "iterations": list(range(1, STEPS + 1)),
        "steady_state_window": [3, STEPS],
        "steady_state_mean_s": 1.0,
        "steady_state_min_s": 1.0,
        "steady_state_max_s": 1.0,
        "steady_state_rule": "automatic: the first 2 of 10 steps left out as warm-up (max(2, 10 %))",
        "tokens_per_s": 2048.0,
        "tflops_per_gpu": 0.0021,
        "peak_memory_gib": 1.1,
        "world_size": 16 if emulated else 2,
        "device": device,
        "extra": {},
        "emulation": None,
    }
    if emulated:
        summary["extra"]["modeled_comm_s"] = [0.25] * STEPS
        summary["emulation"] = {
            "emulated": True,
            "rank": 0,
            "world_size": 16,
            "network": {"name": "h100_ib400", "gpus_per_node": 8},
        }
    return summary


def _rows(text: str) -> dict[str, str]:
    return {m.group(1).strip(): m.group(2) for m in re.finditer(r"^(\S.*?)  +(\S.*)$", text, re.M)}


def test_a_cpu_runs_table_marks_its_throughput_as_no_gpu_figure():
    text = format_results(_summary("cpu", emulated=False), "summary.json")
    rows = _rows(text)
    assert "CPU smoke mode" in text
    tflops = next(v for k, v in rows.items() if k.startswith("TFLOP/s"))
    assert tflops != "0.0" and "CPU" in tflops, tflops
    tokens = next(v for k, v in rows.items() if k.startswith("tokens/s"))
    assert "CPU" in tokens, tokens


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_an_emulated_runs_table_says_modeled_names_the_network_and_shows_the_modeled_communication(device):
    text = format_results(_summary(device, emulated=True), "summary.json")
    assert "EMULATED" in text and "'h100_ib400'" in text and "modeled" in text
    rows = _rows(text)
    comm = next(v for k, v in rows.items() if "modeled communication" in k)
    assert "0.2500 s" in comm and "2.5000 s" in comm, comm  # per step over the window, and the run's total
    tokens = next((k, v) for k, v in rows.items() if k.startswith("tokens/s"))
    assert "16" in " ".join(tokens) and "one process" in " ".join(tokens), tokens  # what it is, not a measurement


def test_a_gpu_runs_table_shows_its_numbers_plainly_and_the_windows_rule():
    text = format_results(_summary("cuda", emulated=False), "summary.json")
    rows = _rows(text)
    assert rows["tokens/s"] == "2,048" and rows["TFLOP/s/GPU"] == "0.0021"
    assert "EMULATED" not in text and "CPU" not in text
    window = rows["steady-state window"]
    assert window.startswith("iterations 3-10") and "max(2, 10 %)" in window, window


@pytest.mark.parametrize(
    "window, label",
    [
        (None, "iterations 3-10 (automatic: the first 2 of 10 steps left out as warm-up"),
        ([2, 4], "iterations 2-4 (--steady_state_window 2,4)"),
    ],
    ids=["automatic", "asked"],
)
def test_a_summary_without_its_window_gets_the_rule_or_the_asked_window(window, label):
    summary = {k: v for k, v in _summary("cuda", emulated=False).items() if not k.startswith("steady_state")}
    assert label in format_results(summary, "summary.json", window)
