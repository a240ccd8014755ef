"""Detection of optional packages (Transformer Engine, DeepEP) without importing them eagerly."""

from __future__ import annotations

import functools
import importlib.util
from importlib import metadata
from typing import Optional

from packaging.version import Version

_TE_DISTRIBUTIONS = ("transformer-engine", "transformer_engine", "transformer-engine-torch")


@functools.cache
def transformer_engine_version() -> Optional[Version]:
    """Installed Transformer Engine version, or ``None`` when TE does not import.

    A distribution record alone is not enough: TE must import (its CUDA libraries load at import).
    """
    try:
        # Deferred: Transformer Engine is optional, and loads its CUDA libraries at import.
        import transformer_engine  # noqa: F401
        import transformer_engine.pytorch  # noqa: F401
    except Exception:  # any import failure (missing package, missing CUDA libs) means "absent"
        return None
    for name in _TE_DISTRIBUTIONS:
        try:
            return Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
    version = getattr(transformer_engine, "__version__", None)
    return Version(str(version)) if version else None


def have_transformer_engine() -> bool:
    """True when Transformer Engine imports."""
    return transformer_engine_version() is not None


def describe_transformer_engine() -> str:
    """``"absent"`` or the installed version, for logs and error messages."""
    version = transformer_engine_version()
    return "absent" if version is None else str(version)


def have_deep_ep() -> bool:
    """True when the ``deep_ep`` package (needed by the flex dispatcher backends) is importable."""
    return importlib.util.find_spec("deep_ep") is not None


@functools.cache
def have_te_nccl_ep() -> bool:
    """True when Transformer Engine imports with its NCCL expert-parallel module
    (``transformer_engine.pytorch.ep``, built with ``NVTE_BUILD_WITH_NCCL_EP=1``), which the ``ncclep``
    flex backend calls. Without TE it is ``False`` at once (nothing is imported)."""
    if transformer_engine_version() is None:
        return False
    try:
        # Deferred: only asked where TE imports; a TE built without NCCL EP lacks the module.
        from transformer_engine.pytorch import ep  # noqa: F401
    except Exception:  # any import failure means the backend cannot run here
        return False
    return True
