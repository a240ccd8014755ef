"""When a run captures its whole-iteration CUDA graph (``model.cuda_graph_impl="full_iteration"``).

megatron-core's capture wrapper runs ``model.cuda_graph_warmup_steps`` eager steps, captures the next
one and replays the graph after it. The rules (``cuda_graph_rules.py``) need the capturing iteration
of a fresh run before launch; the loop (``training/devices/cuda_graphs.py``) needs it for a resumed
run too. Both compute it here.
"""

from __future__ import annotations

from typing import Any

FULL_ITERATION = "full_iteration"
"""The ``model.cuda_graph_impl`` value that captures each step's forward+backward."""


def captures_full_iteration(model_cfg: Any) -> bool:
    return model_cfg.cuda_graph_impl == FULL_ITERATION


def capture_iteration(first_iteration: int, warmup_steps: int) -> int:
    """The iteration whose step captures the graph: the first one this process trains, after
    ``warmup_steps`` eager ones."""
    return first_iteration + warmup_steps


def fresh_capture_iteration(model_cfg: Any) -> int | None:
    """The capturing iteration of a run that starts at iteration 1 (``None`` without a graph)."""
    if not captures_full_iteration(model_cfg):
        return None
    return capture_iteration(1, int(model_cfg.cuda_graph_warmup_steps))
