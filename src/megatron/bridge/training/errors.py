"""The configuration errors a user catches (``except ConfigValidationError``): the public import
path of :mod:`megatron.bridge.utils.errors`, where they are defined below every other layer."""

from megatron.bridge.utils.errors import (
    CommOverlapConfigError,
    ConfigError,
    ConfigFileNotFoundError,
    ConfigValidationError,
    OverrideError,
    OverridesError,
    Severity,
    UnknownFieldError,
    Violation,
    did_you_mean,
)

__all__ = [
    "CommOverlapConfigError",
    "ConfigError",
    "ConfigFileNotFoundError",
    "ConfigValidationError",
    "OverrideError",
    "OverridesError",
    "Severity",
    "UnknownFieldError",
    "Violation",
    "did_you_mean",
]
