"""How many GPUs this process can see, and the one sentence that says a run needs more.

The harness (before it launches) and ``pretrain()`` (before any process group or CUDA call) both
refuse a GPU run on a machine without enough GPUs, in the same words, instead of failing later in
the driver ("Found no NVIDIA driver") or hanging in NCCL's start-up.
"""

from __future__ import annotations

from megatron.bridge.utils.host import current_host


def visible_gpu_count() -> int:
    """GPUs this process can see (0 without CUDA or with ``CUDA_VISIBLE_DEVICES=""``)."""
    return current_host().gpu_count()


def too_few_gpus(have: int, need: int, asked_by: str) -> str:
    """``this machine has 0 visible GPU(s) but the run needs 2 (-ng 2)``: ``asked_by`` names what asks."""
    return f"this machine has {have} visible GPU(s) but the run needs {need} ({asked_by})"
