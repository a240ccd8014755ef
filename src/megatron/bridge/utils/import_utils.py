"""Which optional packages (Transformer Engine, its NCCL EP module, DeepEP) import on the machine
decisions are made for (:func:`megatron.bridge.utils.host.current_host`), without importing them
eagerly."""

from __future__ import annotations

from typing import Optional

from packaging.version import Version

from megatron.bridge.utils.host import current_host


def transformer_engine_version() -> Optional[Version]:
    """Installed Transformer Engine version, or ``None`` when TE does not import."""
    return current_host().te_version()


def have_transformer_engine() -> bool:
    """True when Transformer Engine imports."""
    return transformer_engine_version() is not None


def describe_transformer_engine() -> str:
    """``"absent"`` or the installed version, for logs and error messages."""
    version = transformer_engine_version()
    return "absent" if version is None else str(version)


def have_deep_ep() -> bool:
    """True when the ``deep_ep`` package (needed by the flex dispatcher backends) is importable."""
    return current_host().deep_ep()


def have_te_nccl_ep() -> bool:
    """True when Transformer Engine imports with its NCCL expert-parallel module
    (``transformer_engine.pytorch.ep``), which the ``ncclep`` flex backend calls."""
    return current_host().te_nccl_ep()
