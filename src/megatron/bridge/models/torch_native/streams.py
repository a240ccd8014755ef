"""Index tensors read on a stream other than the one that made them.

Under megatron-core's EP-overlap schedule (combined 1F1B) the dispatch and combine stages run on a
communication stream while another micro-batch computes on the compute stream. The sorted
dispatchers make their indices and exchange plan on the compute stream and read them again on the
communication stream, last in the backward of the combine, just before their last reference goes.
Unrecorded, the caching allocator could hand that memory to the next compute-stream allocation (the
next micro-batch's attention) while the communication stream's reads are still queued: hidden
while the host lags the GPU, a race once it runs ahead or a CUDA graph replays the step.

Under the standard schedule everything runs on one stream: the dispatchers then keep no stream,
and the host pays nothing (no stream lookup, no allocator call).
"""

from __future__ import annotations

import torch


def stream_of(t: torch.Tensor) -> torch.cuda.Stream | None:
    """The current stream of ``t``'s device, for a CUDA tensor made now (``None`` on CPU)."""
    return torch.cuda.current_stream(t.device) if t.is_cuda else None


def record_if_read_elsewhere(made_on: torch.cuda.Stream | None, *tensors: torch.Tensor) -> None:
    """``record_stream`` of the current stream on ``tensors`` (made on ``made_on``), where that is
    another stream: the allocator then keeps their memory until that stream's queued work is done."""
    if made_on is None:
        return
    current = torch.cuda.current_stream(made_on.device)
    if current != made_on:
        for t in tensors:
            t.record_stream(current)


__all__ = ["record_if_read_elsewhere", "stream_of"]
