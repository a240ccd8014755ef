"""The emulated backend's host cost per collective: every kind timed, in bursts the GPU keeps up with."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from perf_scripts import load_script

SCRIPT = load_script("emulation_host_cost.py")


def test_each_kind_is_timed_and_profiled_and_the_figures_written(tmp_path, capsys):
    out = tmp_path / "cost.json"
    argv = ["--calls", "2", "--network", "free", "--json", str(out), "--profile", "3", "--commit", "abc1234"]
    argv += ["--device", "cpu"]  # the same verdict on a GPU machine: the test names where the tensors live
    SCRIPT.main(argv)
    figures = json.loads(out.read_text())
    portable = " ".join(argv).replace(str(out), "runs/emulation_host_cost.json")
    assert figures["command"].endswith("emulation_host_cost.py " + portable) and str(tmp_path) not in figures["command"]
    assert (figures["commit"], figures["gpu"]) == ("abc1234", "no GPU")
    assert figures["host"]["torch_op_us"] > 0
    assert set(figures["host_us_per_call"]) == set(SCRIPT.cases(torch.device("cpu")))
    assert all(us > 0 for us in figures["host_us_per_call"].values())
    assert (figures["network"], figures["calls"]) == ("free", 2)
    printed = capsys.readouterr().out
    assert printed.count("calls, by own time") == len(figures["host_us_per_call"])


@pytest.mark.parametrize("calls, bursts", [(1, [1]), (50, [50]), (120, [50, 50, 20])])
def test_calls_go_in_bursts_short_enough_for_the_gpu_queue(calls, bursts):
    issued, made = [0], []

    @contextlib.contextmanager
    def burst():
        before = issued[0]
        yield
        made.append(issued[0] - before)

    def call():
        issued[0] += 1

    SCRIPT._bursts(call, calls, torch.device("cpu"), burst)
    assert made == bursts and SCRIPT.BURST == 50


@pytest.mark.parametrize("argv", [["--calls", "0"], ["--profile", "-1"]])
def test_a_bad_count_is_refused(argv, capsys):
    with pytest.raises(SystemExit):
        SCRIPT.main(argv)
    assert "must be at least 1" in capsys.readouterr().err
