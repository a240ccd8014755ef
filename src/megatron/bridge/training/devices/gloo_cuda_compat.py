"""Gloo on CUDA tensors (several ranks sharing one GPU, where NCCL refuses): run megatron-core's
coalesced data-parallel collectives one by one.

megatron-core's DDP and distributed optimizer issue their bucket collectives inside
``torch.distributed._coalescing_manager``. Gloo cannot coalesce collectives on CUDA tensors (seen on
one H200, torch 2.11: ``ProcessGroupGloo::allreduce_coalesced: unsupported device type cuda``;
the distributed optimizer's coalesced reduce-scatter crashed the process), while each collective on
its own works. This module swaps the manager megatron's buffers use for one that lets every
collective run by itself, synchronously. Asynchronous (overlapped) use is refused, so
``overlap_grad_reduce``/``overlap_param_gather`` must be off in this mode; the overlap rules say so.

Only ever activated for ``dist.device == "cuda"`` with the gloo backend, and it says so in the log.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)

_ENABLED = False


class _SynchronousCollectives:
    """What megatron expects from the manager: a ``wait()`` (nothing is pending here)."""

    def wait(self) -> None:
        return None


@contextlib.contextmanager
def sequential_coalescing_manager(group: Any = None, device: Any = None, async_ops: bool = False) -> Iterator[Any]:
    """Drop-in for ``torch.distributed._coalescing_manager``: collectives inside run one by one."""
    if async_ops:
        raise RuntimeError(
            "gloo on CUDA tensors runs megatron's data-parallel collectives synchronously: set "
            "comm_overlap.overlap_grad_reduce=false and comm_overlap.overlap_param_gather=false"
        )
    yield _SynchronousCollectives()


def enable_gloo_cuda_compat() -> None:
    """Install the sequential manager into megatron-core's gradient/parameter buffers (idempotent)."""
    global _ENABLED
    if _ENABLED:
        return
    # Deferred: the megatron-core module this layer patches is imported when it is enabled.
    from megatron.core.distributed import param_and_grad_buffer

    param_and_grad_buffer._coalescing_manager = sequential_coalescing_manager
    _ENABLED = True
    logger.warning("gloo on CUDA tensors: megatron-core's coalesced DP collectives run one by one, synchronously")
    print("[megatron.bridge] gloo on CUDA tensors: DP collectives run one by one (no coalescing)", flush=True)


def gloo_cuda_compat_enabled() -> bool:
    """True once :func:`enable_gloo_cuda_compat` ran in this process."""
    return _ENABLED
