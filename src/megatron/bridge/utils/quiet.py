"""Known third-party noise, silenced unless the user asks for everything (``--verbose``).

One list serves the harness process and every rank (the entry point applies it before torch and
megatron-core are imported, because most of these warnings are raised at import time). Each entry
is a message a user cannot act on: the start-up lines already say what it means (for example
"Transformer Engine absent" once, instead of five import-time warnings per rank).

Nothing here hides an error: only the warnings and the log records below ERROR listed here are
dropped.
"""

from __future__ import annotations

import logging
import warnings
from typing import Iterable

KNOWN_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    (UserWarning, r"Transformer Engine and Apex are not installed"),
    (UserWarning, r"Apex is not installed"),
    (UserWarning, r"absl\.logging is not installed"),
    (UserWarning, r"MimoModelConfig is experimental"),
    (SyntaxWarning, r"invalid escape sequence"),
    (FutureWarning, r"Please use DTensor instead and we are deprecating ShardedTensor"),
    (UserWarning, r"The argument order of load has been changed"),
    (UserWarning, r"torch\.distributed is disabled, unavailable or uninitialized, assuming the intent is to load"),
)
"""(category, message regex) of warnings raised while importing megatron-core without TE/Apex, and
the notices of torch's distributed checkpoint that megatron-core's loader triggers on every load
(it reads the common state on each rank, as intended)."""

KNOWN_LOG_RECORDS: tuple[tuple[str, str], ...] = (
    ("megatron.core.models.gpt.gpt_model", "GPTModel IS DEPRECATED"),
    ("megatron.core.distributed.distributed_data_parallel", "full_param_layout not provided"),
    ("megatron.core.datasets.gpt_dataset", "Unable to save MockGPTDataset indexes"),
    ("megatron.core.rerun_state_machine", "Implicit initialization of Rerun State Machine"),
    ("megatron.core.rerun_state_machine", "RerunStateMachine initialized in mode"),
    ("megatron.core.dist_checkpointing.strategies.torch", "MCore's async save is deprecated"),
    ("megatron.bridge.training.cpu_compat", "CPU smoke mode: megatron-core CUDA calls mapped to CPU"),
    ("megatron.bridge.models.torch_native.dispatcher", "torch_native MoE: "),
)
"""(logger name, message text) of log records that repeat on every rank and need no action
(the CPU smoke-mode banner and the MoE dispatcher choice are also printed once by rank 0's start-up
lines, so their log copies go)."""

THIRD_PARTY_LOGGERS: tuple[str, ...] = ("megatron.core",)
"""Loggers whose INFO records (config dumps, bucket listings) are shown only with ``--verbose``."""

SILENCED_LOGGERS: tuple[str, ...] = ("torch.utils.cpp_extension",)
"""Loggers with their own handlers (torch's), muted below ERROR before torch is imported: their one
record says "No CUDA runtime is found" on CPU hosts, where that is expected."""


def silence_known_warnings(known: Iterable[tuple[type[Warning], str]] = KNOWN_WARNINGS) -> None:
    """Ignore the known import-time warnings in this process (call before importing megatron-core)."""
    for category, message in known:
        warnings.filterwarnings("ignore", message=message, category=category)


class KnownRecordFilter(logging.Filter):
    """Drops the known, non-actionable log records below ERROR."""

    def __init__(self, known: Iterable[tuple[str, str]] = KNOWN_LOG_RECORDS) -> None:
        super().__init__()
        self.known = tuple(known)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        message = record.getMessage()
        return not any(record.name == name and text in message for name, text in self.known)


def configure_logging(*, verbose: bool, rank: str, main_rank: bool) -> None:
    """Rank-prefixed logging; without ``verbose``: WARNING for third-party loggers, this package's
    INFO lines on the first rank only, known records dropped."""
    logging.basicConfig(level=logging.INFO, format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s")
    if verbose:
        return
    silence_known_warnings()
    _mute(SILENCED_LOGGERS)
    for handler in logging.getLogger().handlers:
        handler.addFilter(KnownRecordFilter())
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    if not main_rank:
        logging.getLogger("megatron.bridge").setLevel(logging.WARNING)


def silence_harness_noise() -> None:
    """The harness process: known warnings and records gone (it prints its own summary lines)."""
    silence_known_warnings()
    _mute(SILENCED_LOGGERS)


def _mute(names: Iterable[str]) -> None:
    for name in names:
        logging.getLogger(name).setLevel(logging.ERROR)
