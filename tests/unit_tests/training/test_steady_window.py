"""The steady-state window follows the run: the first max(2, 10 %) of its steps are warm-up, the
rest is timed (``telemetry/steady_window.py``); a window set in ``logger.steady_state_window`` is
used as set. Checked through the rule, ``summary.json`` (``MetricsLogger``) and ``validate()``."""

from __future__ import annotations

import json

import pytest

from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.config_stages.resolution.finalize import resolve_config
from megatron.bridge.training.telemetry.metrics import MetricsLogger
from megatron.bridge.training.telemetry.steady_window import SteadyWindow, automatic_window


@pytest.mark.parametrize(
    "steps, capture_step, first_parked_step, window",
    [
        (8, None, None, (3, 8)),  # Megatron-Bridge's 3-8 on its 8-step perf runs
        (10, None, None, (3, 10)),
        (50, None, None, (6, 50)),  # 10 % of 50: five warm-up steps, not two
        (100, None, None, (11, 100)),
        (3, None, None, (3, 3)),
        (2, None, None, None),  # nothing after the warm-up
        (10, 3, None, (4, 10)),  # a CUDA-graph capture in step 3 stays out
        (14, None, 13, (3, 12)),  # parked steps (13, 14) stay out
    ],
    ids=lambda v: str(v),
)
def test_the_automatic_window_leaves_out_the_warm_up_and_the_slow_steps(steps, capture_step, first_parked_step, window):
    assert automatic_window(steps, capture_step=capture_step, first_parked_step=first_parked_step) == window


@pytest.mark.parametrize(
    "steps, window, rule_words",
    [
        (50, [6, 50], "automatic: the first 5 of 50 steps left out as warm-up (max(2, 10 %))"),
        (8, [3, 8], "automatic: the first 2 of 8 steps left out as warm-up (max(2, 10 %))"),
        (2, [2, 2], "too few steps for the automatic window"),
    ],
    ids=["50", "8", "2"],
)
def test_summary_json_times_the_window_the_rule_gives_and_says_which(tmp_path, steps, window, rule_words):
    log = MetricsLogger(
        train_iters=steps, tokens_per_step=100, flops_per_step=None, world_size=1, device="cpu", log_dir=str(tmp_path)
    )
    for i in range(1, steps + 1):
        log.record(i, loss=1.0, step_time_s=float(i))
    data = json.loads(log.write_summary().read_text())
    assert data["steady_state_window"] == window
    timed = range(window[0], window[1] + 1)
    assert data["steady_state_mean_s"] == pytest.approx(sum(timed) / len(timed))
    assert rule_words in data["steady_state_rule"]


def test_a_window_set_in_the_config_is_used_as_set(tmp_path):
    log = MetricsLogger(
        train_iters=50,
        tokens_per_step=100,
        flops_per_step=None,
        world_size=1,
        device="cpu",
        log_dir=str(tmp_path),
        steady_state_window=SteadyWindow(set_to=(3, 8)),
    )
    for i in range(1, 51):
        log.record(i, loss=1.0, step_time_s=float(i))
    data = json.loads(log.write_summary().read_text())
    assert data["steady_state_window"] == [3, 8] and data["steady_state_rule"] == "logger.steady_state_window=[3, 8]"


def test_the_recipe_leaves_the_window_to_the_rule_and_parked_steps_need_one_steady_step_first():
    cfg = qwen3_moe_tiny_pretrain_config()
    assert cfg.logger.steady_state_window is None
    cfg.train.train_iters = 4
    cfg.profiling.gpu_park_steps = [3]  # the warm-up is steps 1-2: no steady step before the park
    errors = {v.rule for v in resolve_config(cfg, world_size=1).errors}
    assert "gpu-park-steps-after-window" in errors
    cfg.train.train_iters, cfg.profiling.gpu_park_steps = 14, [13, 14]
    assert "gpu-park-steps-after-window" not in {v.rule for v in resolve_config(cfg, world_size=1).errors}
