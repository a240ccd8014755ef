"""The flex dispatcher backends' names: the one place they are defined, below the model and the
training layers (where each runs: ``training.flex_dispatcher_backend.FLEX_BACKEND_SUPPORT``).

``deepep`` and ``hybridep`` are kernels of the ``deep_ep`` package; ``ncclep`` is NCCL's expert
parallelism through Transformer Engine (``transformer_engine.pytorch.ep``)."""

from typing import Literal

FLEX_BACKENDS: tuple[str, ...] = ("deepep", "hybridep", "ncclep")
FlexBackend = Literal[FLEX_BACKENDS]  # type: ignore[valid-type]
DEEP_EP_BACKENDS: tuple[str, ...] = ("deepep", "hybridep")
"""The backends built from the ``deep_ep`` package."""
