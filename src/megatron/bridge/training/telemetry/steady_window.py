"""Which steps a run's steady-state step time is the mean of.

``logger.steady_state_window=[first, last]`` names them (steps of this run, 1-based, inclusive).
Left unset (the default) the window follows the run: its first max(2, 10 %) steps are warm-up
(allocator growth, first touches, torch.compile and Triton picking kernels) and are left out, and
the window runs to the last step, so an 8-step run is timed over steps 3-8 (Megatron-Bridge's
window) and a 50-step run over steps 6-50. A step known to be slow for another reason stays out
too: the step that captures a CUDA graph (the window starts after it) and parked steps
(``profiling.gpu_park_steps``: the window ends before the first). Nothing here imports torch: the
validation rules and the harness use it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

WARMUP_MIN_STEPS = 2
WARMUP_FRACTION = 0.10
RULE_TEXT = "max(2, 10 %)"
"""How the automatic window's warm-up is counted, as the Results table and ``summary.json`` say it."""


def warmup_steps(steps: int) -> int:
    """The steps an automatic window leaves out at the start of a run of ``steps`` steps."""
    return max(WARMUP_MIN_STEPS, math.ceil(WARMUP_FRACTION * steps))


def automatic_window(
    steps: int, *, capture_step: int | None = None, first_parked_step: int | None = None
) -> tuple[int, int] | None:
    """``(first, last)`` of a run of ``steps`` steps; ``None`` when no step is left to time."""
    first = max(warmup_steps(steps), capture_step or 0) + 1
    last = steps if first_parked_step is None else min(steps, first_parked_step - 1)
    return (first, last) if first <= last else None


@dataclass(frozen=True)
class SteadyWindow:
    """How a run chooses its window: ``set_to`` (``logger.steady_state_window``), else automatically
    around the steps known to be slow (both in steps of this run)."""

    set_to: tuple[int, int] | None = None
    capture_step: int | None = None
    """The step that captures the whole-iteration CUDA graph."""
    first_parked_step: int | None = None

    @classmethod
    def of_run(cls, cfg: Any, start_iteration: int = 0) -> SteadyWindow:
        """The window of a run of ``cfg`` that starts after ``start_iteration`` (a resume)."""
        window = cfg.logger.steady_state_window
        graphed = cfg.model.cuda_graph_impl == "full_iteration"
        parked = [s - start_iteration for s in cfg.profiling.gpu_park_steps if s > start_iteration]
        return cls(
            set_to=tuple(window) if window is not None else None,
            capture_step=int(cfg.model.cuda_graph_warmup_steps) + 1 if graphed else None,
            first_parked_step=min(parked) if parked else None,
        )

    def choose(self, steps: int) -> tuple[tuple[int, int] | None, str]:
        """The window for a run that took ``steps`` steps (``None`` before any step) and how it was
        chosen, in words for ``summary.json`` and the Results table."""
        if self.set_to is not None:
            return self.set_to, f"logger.steady_state_window=[{self.set_to[0]}, {self.set_to[1]}]"
        window = automatic_window(steps, capture_step=self.capture_step, first_parked_step=self.first_parked_step)
        if window is None:
            fallback = None if steps == 0 else (2, steps) if steps > 1 else (1, 1)
            timed = "every step after the first" if steps > 1 else "its only step"
            return fallback, f"too few steps for the automatic window ({RULE_TEXT} warm-up steps): {timed}"
        also = []
        if self.capture_step is not None and self.capture_step > warmup_steps(steps):
            also.append(f"the CUDA-graph capture (step {self.capture_step})")
        if self.first_parked_step is not None and self.first_parked_step <= steps:
            also.append(f"the parked steps (from step {self.first_parked_step})")
        return window, (
            f"automatic: the first {warmup_steps(steps)} of {steps} steps left out as warm-up "
            f"({RULE_TEXT})" + (f"; also {' and '.join(also)}" if also else "")
        )
