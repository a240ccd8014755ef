"""Memory inside a whole-iteration CUDA-graph capture that spans several streams.

Under EP overlap the captured step runs the token exchanges on a communication stream beside the
compute stream, and every tensor one stream hands the other is recorded for the second stream
(``Tensor.record_stream``) before it is freed. Eagerly, the caching allocator reuses such a block
once an event says the other stream is done with it; during a capture it cannot query events, so by
default it keeps every such block reserved until the capture ends, which over a step's
micro-batches can exhaust the GPU.

torch's allocator option ``graph_capture_record_stream_reuse`` lets a capture reuse such a block
once the graph's own dependencies prove the other stream's use is finished: it changes which
addresses the capture hands out, not which kernels a replay runs (the measurement:
``docs/benchmarks/implementation_costs.md``). The training loop turns it on for the capture unless the user's
``PYTORCH_ALLOC_CONF`` / ``PYTORCH_CUDA_ALLOC_CONF`` sets it either way, and says which in the start-up line and
``summary.json``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import torch

from megatron.bridge.training.config_stages.facts.graph_capture import ALLOCATOR_VARS, allocator_conf

logger = logging.getLogger(__name__)

OPTION = "graph_capture_record_stream_reuse"
ENV_VARS = ALLOCATOR_VARS


@dataclass(frozen=True)
class CaptureMemoryReuse:
    """Whether the capture reuses blocks freed across streams, and who decided."""

    enabled: bool
    source: str
    """Who decided: the training loop, the user's allocator variable (named), or why it is off."""
    set_here: bool = False
    """Whether the loop is to set the option itself (no explicit user setting)."""
    applied: bool = False
    """Whether the loop has set it in torch's allocator (and so resets it when the run ends)."""

    def describe(self) -> str:
        state = "reused" if self.enabled else "kept until the capture ends"
        return f"blocks freed across streams during the capture {state} ({OPTION}, {self.source})"


def decide(environ: Mapping[str, str]) -> CaptureMemoryReuse:
    """The user's explicit choice if the allocator options make one, else on (set by the loop)."""
    name, options = allocator_conf(environ)
    if options.get("backend") == "cudaMallocAsync":
        return CaptureMemoryReuse(False, f"not applicable: {name} selects cudaMallocAsync, which tracks graphs itself")
    if OPTION in options:
        return CaptureMemoryReuse(options[OPTION] == "True", f"as {name} sets it")
    return CaptureMemoryReuse(True, "set by the training loop", set_here=True)


def _setter() -> Callable[[str], None]:
    """torch's run-time allocator-option setter (newer releases deprecate the ``torch.cuda`` name)."""
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    return setter if setter is not None else torch.cuda.memory._set_allocator_settings


def apply(decision: CaptureMemoryReuse) -> CaptureMemoryReuse:
    """Set the option where the loop owns it; what actually holds (off, with the reason, if this
    torch does not know the option)."""
    if not decision.set_here:
        return decision
    try:
        _setter()(f"{OPTION}:True")
    except (RuntimeError, ValueError) as exc:
        logger.warning(
            "torch %s cannot set %s (%s); the capture keeps freed blocks reserved until it ends.",
            torch.__version__,
            OPTION,
            exc,
        )
        return replace(decision, enabled=False, source=f"not in torch {torch.__version__}", set_here=False)
    return replace(decision, applied=True)


def undo(decision: CaptureMemoryReuse) -> CaptureMemoryReuse:
    """Put the option back to torch's default where the loop set it (a later run decides anew); the
    decision as it then stands, to apply again for another capture."""
    if not decision.applied:
        return decision
    _setter()(f"{OPTION}:False")
    return replace(decision, applied=False)
