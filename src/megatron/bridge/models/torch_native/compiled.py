"""``torch.compile`` for the torch-native modules' small fused functions, with an eager way out.

Each function is compiled on its first CUDA call. A compiler failure must not stop a training run:
it is logged once and that function runs eagerly for the rest of the process.
``MBRIDGE_TORCH_NATIVE_COMPILE=0`` switches every compiled path off (A/B timing, debugging).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

import torch

logger = logging.getLogger(__name__)


class LazyCompiled:
    """``fn`` compiled on first use; ``__call__`` falls back to the caller's eager path."""

    def __init__(self, fn: Callable[..., Any], what: str, **compile_kwargs: Any) -> None:
        self.fn, self.what, self._compile_kwargs = fn, what, compile_kwargs
        self._compiled: Callable[..., Any] | None = None
        self.enabled = os.environ.get("MBRIDGE_TORCH_NATIVE_COMPILE", "1") != "0"

    def __call__(self, eager: Callable[..., Any], *args: Any) -> Any:
        """The compiled ``fn(*args)`` while enabled, else (or after a compiler failure) ``eager(*args)``."""
        if self.enabled:
            try:
                if self._compiled is None:
                    self._compiled = torch.compile(self.fn, **self._compile_kwargs)
                return self._compiled(*args)
            except Exception as exc:  # a compiler failure must not stop training: stay eager
                self.enabled = False
                logger.warning("torch_native %s: torch.compile failed (%s); using eager ops", self.what, exc)
        return eager(*args)
