"""``torch.compile`` for the torch-native modules' small fused functions, with an eager way out.

Each function is compiled on its first CUDA call. A compiler failure must not stop a training run:
it is logged once and that function runs eagerly for the rest of the process.
``model.torch_native_compile=false`` switches every compiled path off (A/B timing, debugging): the
provider applies it to the process when it builds a model (the compiled functions are module-level,
shared by every layer).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)

_COMPILE_ALLOWED = True


def set_compile_enabled(enabled: bool) -> None:
    """Allow or forbid compiled paths in this process (``model.torch_native_compile``)."""
    global _COMPILE_ALLOWED
    _COMPILE_ALLOWED = bool(enabled)


def compile_enabled() -> bool:
    """Whether compiled paths are allowed in this process."""
    return _COMPILE_ALLOWED


class LazyCompiled:
    """``fn`` compiled on first use; ``__call__`` falls back to the caller's eager path."""

    def __init__(self, fn: Callable[..., Any], what: str, **compile_kwargs: Any) -> None:
        self.fn, self.what, self._compile_kwargs = fn, what, compile_kwargs
        self._compiled: Callable[..., Any] | None = None
        self._failed = False

    @property
    def enabled(self) -> bool:
        """Compiled unless switched off for the process or after this function's compiler failure."""
        return _COMPILE_ALLOWED and not self._failed

    def __call__(self, eager: Callable[..., Any], *args: Any) -> Any:
        """The compiled ``fn(*args)`` while enabled, else (or after a compiler failure) ``eager(*args)``."""
        if self.enabled:
            try:
                if self._compiled is None:
                    self._compiled = torch.compile(self.fn, **self._compile_kwargs)
                return self._compiled(*args)
            except torch.OutOfMemoryError:
                raise  # the GPU is full, not a compiler failure: the eager path would not fit either
            except Exception as exc:  # a compiler failure must not stop training: stay eager
                self._failed = True
                logger.warning("torch_native %s: torch.compile failed (%s); using eager ops", self.what, exc)
        return eager(*args)
