"""Parameter gradients made on the EP communication stream, kept until their accumulation is done.

Under EP overlap (megatron-core's combined 1F1B) the last layer's combine stage also runs the final
layernorm, on the communication stream: that norm's weight gradient is computed there. The
parameter's gradient accumulation runs on another stream, the one the DDP wrapper was built on
(autograd's ``AccumulateGrad`` node, then megatron DDP's hook, which adds ``grad`` into
``main_grad`` and drops it). Autograd orders the add after the communication stream's backward, but
nothing tells the caching allocator about the add: the gradient's memory goes back to the
communication stream's pool the moment DDP drops it, and the next allocation there (the next
micro-batch's dispatch) may overwrite it before the add has read it. Eagerly the host is usually
too slow for that to happen; a replayed CUDA graph keeps only the dependencies, and there the final
norm's gradient came out wrong. Found by ``tests/gpu_checks/stream_checks.py`` (unsafe frees).

The fix is one ``record_stream`` of the accumulating stream on each incoming gradient of those
parameters (a hook on the parameter, run by autograd on that stream, before the gradient is stolen
or added). Under the standard schedule every stage runs on one stream and nothing is registered.
"""

from __future__ import annotations

import torch


def record_on_current_stream(grad: torch.Tensor) -> None:
    """Tell the allocator that the current stream (the accumulating one) still uses ``grad``."""
    if grad.is_cuda:
        grad.record_stream(torch.cuda.current_stream(grad.device))


def _hook(grad: torch.Tensor) -> None:
    record_on_current_stream(grad)  # looked up per call: tests observe it


def params_with_grads_on_comm_stream(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Parameters whose backward runs in megatron's communication-stream stages: the final layernorm,
    run by the last layer's combine stage (a model chunk without it, not last in the pipeline, has none)."""
    decoder = getattr(model, "decoder", None)
    norm = getattr(decoder, "final_layernorm", None)
    return [p for p in norm.parameters() if p.requires_grad] if norm is not None else []


def keep_comm_stream_grads_for_accumulation(model: torch.nn.Module) -> int:
    """Register the hook on every parameter of :func:`params_with_grads_on_comm_stream`; returns
    how many. Call once per model chunk built for the EP-overlap schedule."""
    params = params_with_grads_on_comm_stream(model)
    for param in params:
        param.register_hook(_hook)
    return len(params)


__all__ = ["keep_comm_stream_grads_for_accumulation", "params_with_grads_on_comm_stream", "record_on_current_stream"]
