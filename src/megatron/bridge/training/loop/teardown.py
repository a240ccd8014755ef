"""Release a finished run's model so that a second ``pretrain()`` in the same process has its memory.

Two things tie a finished model to what outlives it, and without undoing them every further run in
one process (a notebook, a benchmark job) starts with the previous run's weights, gradients and
optimizer state still on the GPU:

* megatron-core's token dispatchers keep the last micro-batch's routing probabilities (``probs``)
  as attributes, with their autograd graph. That graph holds the autograd accumulator nodes of the
  router weights, those hold DDP's gradient hooks, and the hooks hold DDP, the model and the
  optimizer: a reference cycle through C++ that Python's garbage collector cannot see.
* the model config (which the caller's config object keeps) holds the optimizer's and DDP's
  methods as schedule hooks (``builders.unwire_model_config`` clears them);
* with the parameter all-gather overlapped over more than one data-parallel rank, DDP's forward
  pre-hooks on every module kept the whole run alive (5.5 GB a run at the Qwen3-30B-A3B width, 4
  layers, in an emulated EP=16 world): :func:`unhook_data_parallel` removes them. Which reference
  outside Python made that cycle uncollectable was not found; removing the hooks was measured to
  free every parameter.

What is left are ordinary reference cycles; :func:`free_memory` collects them once ``pretrain``
has let go of its trainer, so the memory is free when ``pretrain`` returns, not at some later
garbage collection.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable

import torch


def _holders(model_chunks: Iterable[torch.nn.Module]) -> Iterable[object]:
    """Every module of the chunks and every plain object a module keeps as an attribute."""
    for chunk in model_chunks:
        for module in chunk.modules():
            yield module
            for value in vars(module).values():
                if not isinstance(value, (torch.nn.Module, torch.Tensor)) and hasattr(value, "__dict__"):
                    yield value


def drop_autograd_graphs(model_chunks: Iterable[torch.nn.Module]) -> int:
    """Set every tensor attribute that still carries an autograd graph to ``None``; returns how many.

    Only for a model whose training is over: the attributes are per-step state that the next
    forward would overwrite anyway.
    """
    dropped = 0
    for holder in _holders(model_chunks):
        attributes = vars(holder)
        for name, value in list(attributes.items()):
            if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                attributes[name] = None
                dropped += 1
    return dropped


def unhook_data_parallel(model_chunks: Iterable[torch.nn.Module]) -> None:
    """Remove megatron-core DDP's forward pre-hooks (the overlapped parameter all-gather), which
    close over DDP from every module of the model (no final parameter sync: training is over)."""
    for chunk in model_chunks:
        if getattr(chunk, "remove_forward_pre_hook_handles", None):
            chunk.disable_forward_pre_hook(param_sync=False)


def free_memory() -> None:
    """Collect the reference cycles a released model leaves and hand cached GPU memory back."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
