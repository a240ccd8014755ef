"""The GPT forward step megatron-core's schedules call once per micro-batch.

``forward_step(data_iterator, model, return_schedule_plan=False)``: with
``return_schedule_plan=True`` (megatron's combined-1F1B EP-overlap schedule asks for it) it returns
``model.build_schedule_plan(...)`` instead of running the forward, so that the schedule can overlap
one micro-batch's token dispatch/combine with another's compute. Both paths take the same inputs
and share the loss function, which is why the two schedules produce the same losses.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import torch


def model_device(model: torch.nn.Module) -> torch.device:
    """Where ``model`` computes: the device its parameters live on (the run's platform put them there)."""
    return next(model.parameters()).device


def get_batch(data_iterator: Iterator[dict] | None, device: torch.device) -> dict[str, torch.Tensor | None]:
    """Next micro-batch on ``device``. Stages without data (middle PP stages) get Nones."""
    if data_iterator is None:
        return dict(tokens=None, labels=None, loss_mask=None, position_ids=None, attention_mask=None)
    batch = next(data_iterator)
    out: dict[str, torch.Tensor | None] = {}
    for key in ("tokens", "labels", "loss_mask", "position_ids", "attention_mask"):
        value = batch.get(key)
        out[key] = value.to(device, non_blocking=True) if torch.is_tensor(value) else None
    return out


def loss_func(
    loss_mask: torch.Tensor, output_tensor: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Masked sum of per-token losses, the token count, and ``lm loss`` for logging.

    Returning three values lets megatron divide by the token count (and micro-batch count), and
    sum ``[loss_sum, num_tokens]`` across micro-batches for an exact per-token mean.
    """
    losses = output_tensor.float().view(-1)
    mask = loss_mask.float().view(-1)
    loss_sum = torch.sum(losses * mask)
    num_tokens = mask.sum().to(torch.int)
    reporting = torch.stack([loss_sum.detach(), num_tokens.detach().float()])
    return loss_sum, num_tokens, {"lm loss": reporting}


def forward_step(
    data_iterator: Iterator[dict] | None, model: Any, return_schedule_plan: bool = False
) -> tuple[Any, Any]:
    """One micro-batch: the model's output (or its schedule plan) and the loss function."""
    batch = get_batch(data_iterator, model_device(model))
    args = (batch["tokens"], batch["position_ids"], batch["attention_mask"])
    kwargs = dict(labels=batch["labels"], loss_mask=batch["loss_mask"])
    if return_schedule_plan:
        plan = model.build_schedule_plan(*args, **kwargs)
        return plan, partial(loss_func, batch["loss_mask"])
    output = model(*args, **kwargs)
    return output, partial(loss_func, batch["loss_mask"])
