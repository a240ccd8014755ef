"""The errors a user catches (``except ConfigValidationError`` for any configuration problem,
``MachineError`` for a machine that cannot run the config): the public import path of
:mod:`megatron.bridge.utils.error_types`, where they are defined below every other layer."""

from megatron.bridge.utils.error_types import (
    ArgumentError,
    CommOverlapConfigError,
    ConfigError,
    ConfigFileNotFoundError,
    ConfigValidationError,
    MachineError,
    OverrideError,
    OverridesError,
    Severity,
    UnknownFieldError,
    Violation,
    did_you_mean,
)

__all__ = [
    "ArgumentError",
    "CommOverlapConfigError",
    "ConfigError",
    "ConfigFileNotFoundError",
    "ConfigValidationError",
    "MachineError",
    "OverrideError",
    "OverridesError",
    "Severity",
    "UnknownFieldError",
    "Violation",
    "did_you_mean",
]
