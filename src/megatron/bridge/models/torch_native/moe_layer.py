"""The torch-native MoE layer: megatron-core's ``MoELayer`` whose token dispatcher the dispatch path
registry picks and builds.

:func:`~megatron.bridge.models.dispatch.path_registry.choose_dispatch` reads
``config.torch_native_dispatcher`` (``auto``, or the value of a torch-native path:
``models/dispatch/``) and returns the path, transport and reason; the path's ``build`` makes the
dispatcher (a path without one keeps megatron's alltoall dispatcher). The layer itself knows no
dispatcher by name, so a new path is a module and a registry line, not a branch here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from megatron.core.transformer.moe.moe_layer import MoELayer
from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron.bridge.models.dispatch.dispatch_path import DispatchChoice, DispatcherBuild
from megatron.bridge.models.dispatch.path_registry import choose_dispatch

logger = logging.getLogger(__name__)


def dispatch_choices(model_chunks: Iterable[torch.nn.Module]) -> list[DispatchChoice]:
    """The distinct dispatcher choices of the torch-native MoE layers in these model chunks."""
    layers = (m for chunk in model_chunks for m in chunk.modules() if isinstance(m, TorchNativeMoELayer))
    return list(dict.fromkeys(layer.dispatch_choice for layer in layers))


class TorchNativeMoELayer(MoELayer):
    """megatron's ``MoELayer`` with the dispatcher :func:`choose_dispatch` picks."""

    def __init__(self, config: TransformerConfig, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        old = self.token_dispatcher
        choice = choose_dispatch(config, old.ep_size, old.tp_size, old.ep_group, _run_device())
        if choice.path.build is not None:
            self.token_dispatcher = choice.path.build(DispatcherBuild(layer=self, config=config, choice=choice))
        self.dispatch_choice = choice
        logger.debug("torch_native MoE: %s", choice.describe())

    def dispatcher_arguments(self) -> dict:
        """Keyword arguments of a dispatcher built in place of megatron's: the layer's experts and
        the process groups megatron's dispatcher was built with."""
        return dict(
            num_local_experts=self.num_local_experts,
            local_expert_indices=self.local_expert_indices,
            config=self.config,
            pg_collection=_DispatcherGroups(self.token_dispatcher),
        )


def _run_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class _DispatcherGroups:
    """The process groups megatron's dispatcher was built with, in ``ProcessGroupCollection`` shape."""

    def __init__(self, dispatcher: MoEAlltoAllTokenDispatcher):
        self.ep = dispatcher.ep_group
        self.expt_tp = dispatcher.tp_group
        self.tp_ep = dispatcher.tp_ep_group
