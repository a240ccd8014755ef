"""The flex dispatcher backends' names: the one place they are defined, below the model and the
training layers (where each runs: ``training.flex_dispatcher_backend.FLEX_BACKEND_SUPPORT``)."""

from typing import Literal

FLEX_BACKENDS: tuple[str, ...] = ("deepep", "hybridep")
FlexBackend = Literal[FLEX_BACKENDS]  # type: ignore[valid-type]
