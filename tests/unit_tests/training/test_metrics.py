"""Summary maths: steady-state window, throughput, summary.json content."""

from __future__ import annotations

import json

import pytest

from megatron.bridge.training.telemetry.metrics import MetricsLogger, steady_state_stats, throughput

TIMES = [5.0, 3.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 100.0, 100.0]


@pytest.mark.parametrize(
    "times,window,used,mean,lo,hi",
    [
        (TIMES, [3, 8], [3, 8], 3.5, 1.0, 6.0),
        (TIMES, [1, 1], [1, 1], 5.0, 5.0, 5.0),
        (TIMES[:5], [3, 8], [3, 5], 2.0, 1.0, 3.0),  # clipped to what exists
        (TIMES[:2], [3, 8], [2, 2], 3.0, 3.0, 3.0),  # run shorter than the window start
        ([7.0], [3, 8], [1, 1], 7.0, 7.0, 7.0),
    ],
)
def test_steady_state_window(times, window, used, mean, lo, hi) -> None:
    s = steady_state_stats(times, window)
    assert s["steady_state_window"] == used
    assert s["steady_state_mean_s"] == pytest.approx(mean)
    assert (s["steady_state_min_s"], s["steady_state_max_s"]) == (lo, hi)


def test_empty_run_has_no_statistics() -> None:
    assert steady_state_stats([], [3, 8])["steady_state_mean_s"] is None


@pytest.mark.parametrize("window", [[0, 3], [5, 4]])
def test_bad_window_rejected(window) -> None:
    with pytest.raises(ValueError, match="steady_state_window"):
        steady_state_stats(TIMES, window)


def test_throughput() -> None:
    tp = throughput(2.0, tokens_per_step=4096, flops_per_step=8e12, world_size=2)
    assert tp["tokens_per_s"] == 2048
    assert tp["tflops_per_gpu"] == pytest.approx(2.0)
    assert throughput(None, 1, 1.0, 1) == dict(tokens_per_s=None, tflops_per_gpu=None)


def _logger(tmp_path, **kw) -> MetricsLogger:
    args = dict(
        train_iters=10,
        tokens_per_step=1000,
        flops_per_step=1e12,
        world_size=4,
        device="cpu",
        log_dir=str(tmp_path),
    )
    args.update(kw)
    return MetricsLogger(**args)


def test_summary_file(tmp_path, capsys) -> None:
    log = _logger(tmp_path, steady_state_window=[3, 8])
    for i, t in enumerate(TIMES, 1):
        log.record(i, loss=10.0 - i, step_time_s=t, lr=0.1)
    path = log.write_summary(world_size=4, parallel_layout={"ep": 2}, resolved_config="model: {}")
    data = json.loads(path.read_text())
    assert data["losses"] == [10.0 - i for i in range(1, 11)]
    assert data["step_times_s"] == TIMES
    assert data["steady_state_mean_s"] == pytest.approx(3.5)
    assert data["tokens_per_s"] == pytest.approx(1000 / 3.5)
    assert data["tflops_per_gpu"] == pytest.approx(1 / 3.5 / 4)
    assert data["parallel_layout"] == {"ep": 2}
    assert data["extra"]["lr"] == [0.1] * 10
    assert data["peak_memory_gib"] > 0
    line = capsys.readouterr().out.splitlines()[0]
    for word in ("iteration", "loss", "step", "tokens/s", "mem"):
        assert word in line


def test_only_logging_rank_writes(tmp_path, capsys) -> None:
    log = _logger(tmp_path / "x", is_logging_rank=False)
    log.record(1, 1.0, 1.0)
    assert log.write_summary() is None
    assert not (tmp_path / "x").exists()
    assert capsys.readouterr().out == ""


def test_tensorboard_missing_is_a_clear_error(tmp_path) -> None:
    pytest.importorskip("torch")
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="tensorboard"):
            _logger(tmp_path, tensorboard=True)
    else:
        _logger(tmp_path, tensorboard=True)
