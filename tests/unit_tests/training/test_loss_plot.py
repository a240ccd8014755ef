"""Every run draws its loss curve and step times beside ``summary.json`` (``loss.png``), marking the
steady-state window; without matplotlib (the optional ``plots`` extra) it says so in one line and
the run's results are unaffected."""

from __future__ import annotations

import json
import sys

from megatron.bridge.training.telemetry.metrics import MetricsLogger

STEPS = 12


def _run(tmp_path) -> MetricsLogger:
    log = MetricsLogger(
        train_iters=STEPS, tokens_per_step=100, flops_per_step=None, world_size=1, device="cpu", log_dir=str(tmp_path)
    )
    for i in range(1, STEPS + 1):
        log.record(i, loss=8.0 / i, step_time_s=1.0 + 1.0 / i)
    return log


def test_a_run_writes_its_loss_curve_beside_summary_json(tmp_path, capsys):
    summary = _run(tmp_path).write_summary()
    plot = tmp_path / "loss.png"
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert json.loads(summary.read_text())["loss_plot"] == str(plot)
    assert f"loss curve: {plot}" in capsys.readouterr().out


def test_without_matplotlib_the_run_says_so_in_one_line_and_writes_its_summary(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # this host has no matplotlib
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    summary = _run(tmp_path).write_summary()
    assert json.loads(summary.read_text())["loss_plot"] is None and not (tmp_path / "loss.png").exists()
    notes = [line for line in capsys.readouterr().out.splitlines() if "loss curve" in line or "matplotlib is" in line]
    assert notes == ["no loss curve: matplotlib is not installed (uv sync --extra plots)"], notes
