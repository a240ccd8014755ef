"""Whether Transformer Engine imports on the machine decisions are made for
(:func:`megatron.bridge.utils.host.current_host`), without importing it eagerly. The modules a
dispatch path needs are probed through ``current_host().has_package`` (``models/dispatch/``)."""

from __future__ import annotations

from packaging.version import Version

from megatron.bridge.utils.host import current_host


def transformer_engine_version() -> Version | None:
    """Installed Transformer Engine version, or ``None`` when TE does not import."""
    return current_host().te_version()


def have_transformer_engine() -> bool:
    """True when Transformer Engine imports."""
    return transformer_engine_version() is not None


def describe_transformer_engine() -> str:
    """``"absent"`` or the installed version, for logs and error messages."""
    version = transformer_engine_version()
    return "absent" if version is None else str(version)
