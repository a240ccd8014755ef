"""When a run captures its whole-iteration CUDA graph (``model.cuda_graph_impl="full_iteration"``).

megatron-core's capture wrapper runs ``model.cuda_graph_warmup_steps`` eager steps, captures the next
one and replays the graph after it. The rules (``cuda_graph_rules.py``) need the capturing iteration
of a fresh run before launch; the loop (``training/devices/cuda_graphs.py``) needs it for a resumed
run too. Both compute it here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ALLOCATOR_VARS: tuple[str, ...] = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
"""torch's allocator variables, in the order it reads them (the first one set is the one it uses)."""
LAUNCH_ALLOCATOR_VAR = "PYTORCH_CUDA_ALLOC_CONF"
"""The variable a graphed run is launched with (:func:`allocator_env`)."""
EXPANDABLE_SEGMENTS = "expandable_segments:True"
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


def allocator_conf(environ: Mapping[str, str]) -> tuple[str | None, dict[str, str]]:
    """The variable torch reads its allocator options from, and those options (``key:value,...``)."""
    for name in ALLOCATOR_VARS:
        if environ.get(name) is not None:
            pairs = (item.split(":", 1) for item in environ[name].split(",") if ":" in item)
            return name, {key.strip(): value.strip() for key, value in pairs}
    return None, {}


def allocator_env(model_cfg: Any, environ: Mapping[str, str]) -> dict[str, str]:
    """The allocator setting a whole-iteration graph run is launched with: torch's expandable
    segments, unless the user's environment already sets allocator options (then theirs stand).

    The capture's private pool cannot take blocks the default pool keeps cached, and fixed-size
    segments strand what the eager warm-up steps freed: at Qwen3-30B-A3B's 48 layers, EP=16, the
    graphed sorted dispatcher ran out of an H100's memory in its capture with 8.5 GiB reserved but
    unused, and captured and replayed with expandable segments (``docs/training/cuda-graphs.md``)."""
    if not captures_full_iteration(model_cfg) or allocator_conf(environ)[0] is not None:
        return {}
    return {LAUNCH_ALLOCATOR_VAR: EXPANDABLE_SEGMENTS}
