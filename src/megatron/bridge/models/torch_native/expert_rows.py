"""How many expert rows the EP > 1 sorted dispatcher holds a micro-batch, and the check that a
per-rank budget held.

Without a budget its static buffers take the worst case, ``EP x tokens x min(top-k, local experts)``
rows (every source sends this rank each token's local experts), so no routing ever overflows them;
at Qwen3-30B-A3B's EP=16 that is 16 times a balanced rank's ``tokens x top-k``, per layer, kept for
the backward. ``model.torch_native_rank_capacity_factor=F`` sizes the expert-side tensors (the
experts' input, their GEMMs' outputs, the combine's input) for ``ceil(F x tokens x top-k)`` rows
instead, the per-rank token budget megatron-core's ``moe_expert_rank_capacity_factor`` gives HybridEP
and NCCL EP. The exchange's own receive buffer, shared by every layer, stays at the worst case.

The sorted dispatcher never drops a token silently. A micro-batch that routes more rows to some
rank than the budget is exchanged in full into the worst-case buffer; the experts compute the rows
within the budget, the rows past it take a held row's output (finite values, nothing written out of
bounds, never applied), and the step's peak rises. :func:`raise_for_expert_rows_overflow`, called by
the training loop after the backward, reads that peak once a step and stops the run before the
optimizer applies the step. Every rank computes the same peak from the same all-gathered counts, so
every rank stops at the same step.
"""

from __future__ import annotations

import math

import torch


def factor_holds(factor: object) -> bool:
    """A usable ``torch_native_rank_capacity_factor``: ``None``, or a finite number of at least 1.0
    (below a balanced rank's share every micro-batch overflows: the ranks' mean is exactly it)."""
    if factor is None:
        return True
    return isinstance(factor, (int, float)) and not isinstance(factor, bool) and 1.0 <= factor < math.inf


def worst_case_rows(ep_size: int, tokens: int, topk: int, local_experts: int) -> int:
    """Rows one rank can receive in one micro-batch whatever the routing."""
    return ep_size * tokens * min(topk, local_experts)


def budget_rows(ep_size: int, tokens: int, topk: int, local_experts: int, factor: float | None) -> int:
    """The expert rows one rank holds: ``ceil(factor x tokens x top-k)``, at most the worst case
    (``factor`` ``None``: the worst case)."""
    worst = worst_case_rows(ep_size, tokens, topk, local_experts)
    if factor is None:
        return worst
    return min(worst, math.ceil(factor * tokens * topk))


def rows_a_token(ep_size: int, topk: int, local_experts: int, factor: float | None) -> float:
    """:func:`budget_rows` per token of the micro-batch (the memory estimate's multiplier)."""
    worst = float(ep_size * min(topk, local_experts))
    return worst if factor is None else min(worst, factor * topk)


class ExpertRowsOverflow(RuntimeError):
    """A micro-batch routed more rows to one EP rank than its budget; the step was not applied."""


class _StepPeak:
    """The most rows any rank was sent in one micro-batch this step, kept on the device.

    One tensor per device, allocated at the first :meth:`note` (before any CUDA-graph capture: the
    training loop runs eager steps first), updated in place by each EP dispatch (capturable) and read
    and zeroed by :meth:`take`, once a step, on the host. The limits stay until :meth:`reset`: a
    replayed graph updates the peak without running :meth:`note` on the host.
    """

    def __init__(self) -> None:
        self._peaks: dict[torch.device, torch.Tensor] = {}
        self._limits: tuple[int, int] | None = None  # (budget rows, balanced rows: tokens x top-k)

    def note(self, peak: torch.Tensor, budget: int, balanced: int) -> None:
        """Fold one micro-batch's ``[1]`` peak into the step's; ``budget`` rows were allowed and
        ``balanced`` (tokens x top-k) is a perfectly balanced rank's share."""
        step_peak = self._peaks.get(peak.device)
        if step_peak is None:
            step_peak = self._peaks[peak.device] = torch.zeros_like(peak)
        torch.maximum(step_peak, peak, out=step_peak)
        self._limits = (budget, balanced)

    def take(self) -> tuple[int, int, int] | None:
        """``(peak, budget, balanced)`` rows of the step, then the peak is zeroed; ``None`` where no
        bounded dispatch ran since the last :meth:`reset`."""
        if self._limits is None:
            return None
        peak = max(int(p.item()) for p in self._peaks.values())
        budget, balanced = self._limits
        for p in self._peaks.values():
            p.zero_()
        return peak, budget, balanced

    def reset(self) -> None:
        """Forget a step that never finished (a new run in the same process starts clean)."""
        for p in self._peaks.values():
            p.zero_()
        self._limits = None


STEP_PEAK = _StepPeak()


def raise_for_expert_rows_overflow(iteration: int) -> None:
    """Raise :class:`ExpertRowsOverflow` where a micro-batch of this step went over the budget (a
    host read only where a budget is in use)."""
    taken = STEP_PEAK.take()
    if taken is None or taken[0] <= taken[1]:
        return
    peak, budget, balanced = taken
    raise ExpertRowsOverflow(
        f"iteration {iteration}: a micro-batch routed {peak:,} rows to one expert-parallel rank, over the "
        f"budget of {budget:,} that model.torch_native_rank_capacity_factor allows; the sorted dispatcher "
        "drops no token, so the step was not applied. Fix: set model.torch_native_rank_capacity_factor to "
        f"at least {math.ceil(100 * peak / balanced) / 100:.2f} (this step's most loaded rank over a "
        "balanced one), or to null (the worst case, which no routing exceeds)"
    )


__all__ = [
    "STEP_PEAK",
    "ExpertRowsOverflow",
    "budget_rows",
    "factor_holds",
    "raise_for_expert_rows_overflow",
    "rows_a_token",
    "worst_case_rows",
]
