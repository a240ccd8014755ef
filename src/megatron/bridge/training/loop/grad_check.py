"""``ddp.check_for_nan_in_grad`` for a step whose backward is a captured CUDA graph.

megatron-core's DDP checks each gradient bucket's norm on the host at the end of the backward,
before the data-parallel reduction. Inside a captured graph the host cannot read a GPU value, so a
run with ``model.cuda_graph_impl=full_iteration`` builds DDP without that check and runs this one
instead, after every step's forward+backward (eager warm-up steps and replays alike) and before the
optimizer step: one norm per gradient buffer and a single host read per step. It sees the gradients
after the data-parallel reduction (a NaN or Inf of any rank reaches at least the rank it came
from), and like megatron's check it stops the run before the optimizer applies the bad gradients.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch


class NonFiniteGradientError(RuntimeError):
    """A gradient buffer holds a NaN or Inf after the backward; the optimizer step did not run."""


def _grad_buffers(model_chunks: Iterable[torch.nn.Module]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, grad_data)`` of every gradient buffer of megatron's DDP chunks."""
    for i, chunk in enumerate(model_chunks):
        for kind, buffers in (("dense", chunk.buffers), ("expert-parallel", chunk.expert_parallel_buffers)):
            for j, buffer in enumerate(buffers):
                yield f"model chunk {i}, {kind} gradient buffer {j}", buffer.grad_data


def nonfinite_grad_buffers(model_chunks: Iterable[torch.nn.Module]) -> list[str]:
    """The names of the gradient buffers whose norm is NaN or Inf (one host read for all of them)."""
    named = list(_grad_buffers(model_chunks))
    if not named:
        return []
    norms = torch.stack([torch.linalg.vector_norm(grad, dtype=torch.float32) for _, grad in named])
    finite = torch.isfinite(norms).tolist()
    return [name for (name, _), ok in zip(named, finite) if not ok]


def raise_for_nonfinite_grads(model_chunks: Iterable[torch.nn.Module], iteration: int) -> None:
    """Raise :class:`NonFiniteGradientError` naming the buffers when any gradient is NaN or Inf."""
    bad = nonfinite_grad_buffers(model_chunks)
    if bad:
        raise NonFiniteGradientError(
            f"iteration {iteration}: NaN or Inf in the gradients after the backward ({'; '.join(bad)}); "
            "the optimizer step was not taken (ddp.check_for_nan_in_grad, checked after the backward, "
            "outside the CUDA graph)"
        )
