"""A step's console line stays readable: under 160 columns with the launcher's ``[default0]:`` label,
for the largest numbers a run shows (GPU, emulated, long runs); every value it leaves out is in
``summary.json`` (per step) and, under the harness, in ``launch.log`` (a marked full line)."""

from __future__ import annotations

import json

import pytest

from megatron.bridge.training.telemetry.metrics import MetricsLogger
from megatron.bridge.utils.quiet import MARK_ENV, marked

LABEL = "[default0]:"
LIMIT = 160

# everything a step of an emulated GPU run records (pretrain's _record), at large values
SCALARS = dict(
    lr=0.000123456,
    grad_norm=12345.678,
    host_fwd_bwd_s=1.23456,
    gpu_fwd_bwd_s=1.23456,
    gpu_optimizer_s=0.123456,
    load_balancing_loss=1.0123,
    z_loss=0.00123,
    modeled_comm_s=0.123456,
    emulation_host_s=0.0123456,
)


def _logger(tmp_path, device: str) -> MetricsLogger:
    return MetricsLogger(
        train_iters=100_000,
        tokens_per_step=1024 * 4096 * 64,
        flops_per_step=3.0e17,
        world_size=1024,
        device=device,
        log_dir=str(tmp_path),
    )


@pytest.mark.parametrize(
    "device, scalars",
    [
        ("cuda", SCALARS),
        ("cpu", SCALARS),
        ("cuda", dict(lr=1e-4, grad_norm=1.0)),
    ],
    ids=["emulated-gpu", "emulated-cpu", "gpu"],
)
def test_a_step_line_fits_160_columns_behind_the_launchers_label(tmp_path, capsys, monkeypatch, device, scalars):
    monkeypatch.delenv(MARK_ENV, raising=False)
    log = _logger(tmp_path, device)
    log.record(99_999, loss=12.3456789, step_time_s=0.123456, **scalars)
    log.record(100_000, loss=12.3456789, step_time_s=1234.56, **scalars)  # a slow step: a long ETA field
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    for line in lines:
        assert len(LABEL + line) < LIMIT, (len(LABEL + line), line)
        assert line.startswith("iteration  99999/100000") or line.startswith("iteration 100000/100000")
        assert "loss 12.3457" in line
    if "modeled_comm_s" in scalars:
        assert "modeled" in lines[0]


def test_what_the_line_leaves_out_is_in_summary_json_and_the_harness_log(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(MARK_ENV, "1")  # under the harness: launch.log keeps marked lines, the console not
    log = _logger(tmp_path, "cuda")
    log.record(1, loss=1.0, step_time_s=0.5, **SCALARS)
    out = capsys.readouterr().out.splitlines()
    shown = [line for line in out if not marked(line)]
    full = [line for line in out if marked(line)]
    assert len(shown) == 1 and len(full) == 1, out
    for name in SCALARS:
        assert name in full[0], (name, full[0])
    summary = json.loads(log.write_summary().read_text())
    assert set(SCALARS) <= set(summary["extra"]) and len(summary["extra"]["peak_memory_gib"]) == 1
