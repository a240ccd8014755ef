"""The sorted dispatcher's per-rank budget (``model.torch_native_rank_capacity_factor``): its rows by
hand arithmetic, and the once-a-step check that stops a step over it before the optimizer applies it."""

from __future__ import annotations

import pytest
import torch

from megatron.bridge.models.torch_native import expert_rows
from megatron.bridge.models.torch_native.expert_rows import ExpertRowsOverflow, raise_for_expert_rows_overflow

QWEN3_EP16 = (16, 4096, 8, 8)  # EP, tokens a micro-batch, top-k, local experts


@pytest.mark.parametrize(
    "shape, factor, rows, a_token",
    [
        (QWEN3_EP16, None, 16 * 4096 * 8, 128),  # the worst case: every source sends each token's local experts
        (QWEN3_EP16, 2.0, 2 * 4096 * 8, 16),
        (QWEN3_EP16, 1.25, 40_960, 10),
        (QWEN3_EP16, 1.0001, 32_772, 8.0008),  # rounded up: a balanced rank always fits
        (QWEN3_EP16, 100.0, 16 * 4096 * 8, 128),  # never past the worst case
        ((4, 16, 8, 2), 2.0, 4 * 16 * 2, 8),  # two local experts: the worst case is below 2 x tokens x top-k
    ],
)
def test_budget_rows(shape, factor, rows, a_token) -> None:
    ep, _, topk, local = shape
    assert expert_rows.budget_rows(*shape, factor) == rows
    assert expert_rows.rows_a_token(ep, topk, local, factor) == pytest.approx(a_token)


@pytest.mark.parametrize(
    "factor, holds",
    [
        (None, True),
        (1.0, True),
        (1, True),
        (2.5, True),
        (0.99, False),
        (0.0, False),
        (-1.0, False),
        (float("inf"), False),
        (float("nan"), False),
        (True, False),
        ("2", False),
    ],
)
def test_a_factor_below_a_balanced_share_or_not_a_number_is_refused(factor, holds) -> None:
    assert expert_rows.factor_holds(factor) is holds


@pytest.fixture
def step_peak(monkeypatch):
    peak = expert_rows._StepPeak()
    monkeypatch.setattr(expert_rows, "STEP_PEAK", peak)
    return peak


def test_a_step_within_its_budget_passes_and_starts_the_next_step_clean(step_peak) -> None:
    for rows in (30, 48, 41):
        step_peak.note(torch.tensor([rows]), budget=48, balanced=32)
    raise_for_expert_rows_overflow(iteration=3)
    assert step_peak.take() == (0, 48, 32)  # zeroed by the check: the next step starts from nothing


def test_a_replayed_step_is_checked_without_noting_again(step_peak) -> None:
    """A CUDA graph's replay updates the peak tensor in place and runs no host code: the limits the
    captured step noted stay, so every replayed step is still checked."""
    step_peak.note(torch.tensor([30]), budget=48, balanced=32)
    raise_for_expert_rows_overflow(iteration=3)
    (device_peak,) = step_peak._peaks.values()
    device_peak.fill_(60)  # what a replay's in-place maximum leaves
    with pytest.raises(ExpertRowsOverflow, match="iteration 4: a micro-batch routed 60 rows"):
        raise_for_expert_rows_overflow(iteration=4)
    step_peak.reset()
    assert step_peak.take() is None


def test_a_step_over_its_budget_stops_naming_the_factor_it_needed(step_peak) -> None:
    step_peak.note(torch.tensor([40]), budget=48, balanced=32)
    step_peak.note(torch.tensor([57]), budget=48, balanced=32)
    with pytest.raises(ExpertRowsOverflow) as raised:
        raise_for_expert_rows_overflow(iteration=7)
    text = str(raised.value)
    assert "iteration 7" in text and "57 rows" in text and "budget of 48" in text
    assert "model.torch_native_rank_capacity_factor to at least 1.79" in text  # 57 / 32, rounded up
    assert "not applied" in text and "null" in text
    raise_for_expert_rows_overflow(iteration=8)  # the peak was reset with the read


def test_without_a_budget_the_check_reads_nothing(step_peak, monkeypatch) -> None:
    monkeypatch.setattr(torch.Tensor, "item", lambda self: pytest.fail("a host read without a budget"))
    raise_for_expert_rows_overflow(iteration=1)


def test_a_run_that_stopped_mid_step_leaves_nothing_for_the_next_run(step_peak) -> None:
    step_peak.note(torch.tensor([99]), budget=48, balanced=32)
    step_peak.reset()
    raise_for_expert_rows_overflow(iteration=1)
