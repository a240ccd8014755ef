"""A run whose loss or parameters stop being finite stops there, and none of that state is saved.

megatron-core's ``ddp.check_for_nan_in_grad`` is a setting: with it off, NaN gradients reach the
optimizer, the loss turns NaN a step later and training would go on, saving NaN checkpoints and
naming them latest. Two checks make that impossible whatever the setting says, both cheap:

* every step, the loss the loop already reduced over all ranks and read on the host for its log
  line: NaN or Inf stops the run at that iteration, before its save. Every rank holds the same
  value, so every rank stops at the same iteration without a collective of its own;
* before each save, the parameters (the minimum and maximum of each, one host read, agreed over
  all ranks): the loss of the step whose optimizer applied NaN gradients is still finite, since
  it was computed before the update, and saving that state would publish a checkpoint whose next
  loss is NaN.

Either check raises a :class:`NonFiniteStateError` naming the iteration and the checkpoint that
stays the latest; the loop writes ``summary.json`` with the reason before the error ends the run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch


class NonFiniteStateError(RuntimeError):
    """The loss or the parameters of ``iteration`` are NaN or Inf; nothing of that state was saved."""

    what = "state"

    def __init__(self, iteration: int, detail: str, latest_checkpoint: Any | None) -> None:
        self.iteration, self.detail = iteration, detail
        latest = f"latest checkpoint stays {latest_checkpoint}" if latest_checkpoint else "no checkpoint saved"
        super().__init__(
            f"non-finite {self.what} at iteration {iteration} ({detail}): "
            f"run stopped, iteration {iteration} not saved, {latest}"
        )

    def record(self) -> dict[str, Any]:
        """What ``summary.json`` says about the stop (``stopped_on_nonfinite``)."""
        return dict(iteration=self.iteration, what=self.what, detail=self.detail)


class NonFiniteLossError(NonFiniteStateError):
    """The loss an iteration logged is NaN or Inf."""

    what = "loss"


class NonFiniteParametersError(NonFiniteStateError):
    """A parameter holds NaN or Inf after an iteration's optimizer step (found before its save)."""

    what = "parameters"


def raise_for_nonfinite_loss(loss: float, iteration: int, latest_checkpoint: Any | None) -> None:
    """Raise :class:`NonFiniteLossError` when ``loss`` (the logged, all-reduced loss) is NaN or Inf."""
    if not math.isfinite(loss):
        raise NonFiniteLossError(iteration, f"loss {loss}", latest_checkpoint)


def parameters_finite(model_chunks: Iterable[torch.nn.Module], device: torch.device) -> bool:
    """Whether every parameter of every rank is finite (one host read and one all-reduce).

    ``aminmax`` propagates NaN and keeps an Inf as the minimum or maximum, allocates nothing the
    size of a parameter and, unlike a norm, does not overflow on large finite values.
    """
    extremes = [
        torch.stack(torch.aminmax(p.detach())).float()
        for chunk in model_chunks
        for p in chunk.parameters()
        if p.numel()
    ]
    ok = torch.isfinite(torch.cat(extremes)).all() if extremes else torch.tensor(True)
    flag = ok.to(device=device, dtype=torch.int32).reshape(1)
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
    return bool(flag.item())


def raise_for_nonfinite_parameters(
    model_chunks: Iterable[torch.nn.Module],
    iteration: int,
    device: torch.device,
    latest_checkpoint: Any | None,
    grad_norm: float | None = None,
) -> None:
    """Raise :class:`NonFiniteParametersError` when any rank holds a NaN or Inf parameter.

    A collective: every rank calls it at the same save."""
    if not parameters_finite(model_chunks, device):
        detail = "after the optimizer step" + (f", grad_norm {grad_norm}" if grad_norm is not None else "")
        raise NonFiniteParametersError(iteration, detail, latest_checkpoint)
