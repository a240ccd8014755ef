"""Known third-party noise, silenced unless the user asks for everything (``--verbose``).

One list serves the harness process and every rank (the entry point applies it before torch and
megatron-core are imported, because most of these warnings are raised at import time). Each entry
is a message a user cannot act on: the start-up lines already say what it means (for example
"Transformer Engine absent" once, instead of five import-time warnings per rank).

Nothing here hides an error: only the warnings and the log records below ERROR listed here are
dropped.

Under the harness the ranks drop nothing: the harness sets :data:`MARK_ENV`, and every line the
quiet mode would drop is printed with :data:`QUIET_MARK` in front instead. The harness writes all
of it (mark removed) into ``<log_dir>/launch.log`` and leaves the marked lines out of the console,
so the log holds the ranks' full output while the console stays as short as the quiet mode's.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable

KNOWN_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    (UserWarning, r"Transformer Engine and Apex are not installed"),
    (UserWarning, r"Apex is not installed"),
    (UserWarning, r"absl\.logging is not installed"),
    (UserWarning, r"MimoModelConfig is experimental"),
    (SyntaxWarning, r"invalid escape sequence"),
    (FutureWarning, r"Please use DTensor instead and we are deprecating ShardedTensor"),
    (UserWarning, r"The argument order of load has been changed"),
    (UserWarning, r"torch\.distributed is disabled, unavailable or uninitialized, assuming the intent is to load"),
    (RuntimeWarning, r"Detected a Jax installation but could not find the shared object file for the Transformer"),
)
"""(category, message regex) of warnings raised while importing megatron-core without TE/Apex, and
the notices of torch's distributed checkpoint that megatron-core's loader triggers on every load
(it reads the common state on each rank, as intended), and Transformer Engine's notice, on a machine
that also has JAX, that its JAX extension is not installed (this project uses its PyTorch side)."""

KNOWN_LOG_RECORDS: tuple[tuple[str, str], ...] = (
    ("megatron.core.models.gpt.gpt_model", "GPTModel IS DEPRECATED"),
    ("megatron.core.distributed.distributed_data_parallel", "full_param_layout not provided"),
    ("megatron.core.datasets.gpt_dataset", "Unable to save MockGPTDataset indexes"),
    ("megatron.core.rerun_state_machine", "Implicit initialization of Rerun State Machine"),
    ("megatron.core.rerun_state_machine", "RerunStateMachine initialized in mode"),
    ("megatron.core.dist_checkpointing.strategies.torch", "MCore's async save is deprecated"),
    ("megatron.bridge.training.devices.cpu_compat", "CPU smoke mode: megatron-core CUDA calls mapped to CPU"),
)
"""(logger name, message text) of log records that repeat on every rank and need no action
(the CPU smoke-mode banner is also printed once by rank 0's start-up lines, so its log copies go)."""

THIRD_PARTY_LOGGERS: tuple[str, ...] = ("megatron.core",)
"""Loggers whose INFO records (config dumps, bucket listings) are shown only with ``--verbose``."""

SILENCED_LOGGERS: tuple[str, ...] = ("torch.utils.cpp_extension",)
"""Loggers with their own handlers (torch's), muted below ERROR before torch is imported: their one
record says "No CUDA runtime is found" on CPU hosts, where that is expected."""


SHOW_IMPORT_WARNINGS_ENV = "MEGATRON_BRIDGE_SHOW_IMPORT_WARNINGS"
"""Set to ``1`` to keep megatron-core's, torch's and TE's import-time warnings in a plain Python session."""

_THIRD_PARTY_ORIGIN = {
    False: r"(megatron\.core|torch|transformer_engine)(\.|$)",
    True: r".*[/\\](megatron[/\\]core|torch|transformer_engine)[/\\]",
}
"""Where a known warning must come from to be dropped on import: megatron-core's, torch's or TE's modules
(a compile-time ``SyntaxWarning`` names its file, hence the path form). A user's own code that
raises the same text still shows it."""

_IMPORT_FILTERS: list[tuple] = []
"""The warning filters :func:`quiet_imports` added (removed again by :func:`show_import_warnings`)."""

_FILTERED_LOGGERS: list[logging.Logger] = []
"""The loggers :func:`quiet_imports` gave the known-record filter (taken off by :func:`show_import_warnings`)."""


def _wants_import_warnings() -> bool:
    """The user asked to see them (the variable, or any ``-W``/``PYTHONWARNINGS``), or this is a rank
    under the harness, which marks them instead of dropping them (:data:`MARK_ENV`)."""
    asked = os.environ.get(SHOW_IMPORT_WARNINGS_ENV, "").strip().lower() in ("1", "true", "yes")
    return asked or bool(sys.warnoptions) or os.environ.get(MARK_ENV) == "1"


def quiet_imports() -> None:
    """What ``import megatron.bridge`` does: the known import-time warnings, torch's CPU-host record
    and the known log records (:data:`KNOWN_LOG_RECORDS`, by their loggers, so a user's own script
    that configures no logging does not print them on every rank) are dropped in this process,
    unless :func:`_wants_import_warnings`."""
    if _IMPORT_FILTERS or _wants_import_warnings():
        return
    before = list(warnings.filters)
    silence_known_warnings(third_party_only=True)
    _IMPORT_FILTERS.extend(f for f in warnings.filters if f not in before)
    _mute(SILENCED_LOGGERS)
    for name in sorted({name for name, _ in KNOWN_LOG_RECORDS}):
        logger = logging.getLogger(name)
        logger.addFilter(_KNOWN_RECORDS)
        _FILTERED_LOGGERS.append(logger)


def show_import_warnings() -> None:
    """Undo :func:`quiet_imports` (call it before the first import of a recipe to see megatron-core's
    import-time warnings and its known log records)."""
    while _IMPORT_FILTERS:
        item = _IMPORT_FILTERS.pop()
        if item in warnings.filters:
            warnings.filters.remove(item)
    getattr(warnings, "_filters_mutated", lambda: None)()  # the module caches its filter list
    for name in SILENCED_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)
    while _FILTERED_LOGGERS:
        _FILTERED_LOGGERS.pop().removeFilter(_KNOWN_RECORDS)


def silence_known_warnings(
    known: Iterable[tuple[type[Warning], str]] = KNOWN_WARNINGS, *, third_party_only: bool = False
) -> None:
    """Ignore the known import-time warnings in this process (call before importing megatron-core);
    ``third_party_only``: only where megatron-core, torch or TE raises them (:data:`_THIRD_PARTY_ORIGIN`)."""
    for category, message in known:
        origin = _THIRD_PARTY_ORIGIN[category is SyntaxWarning] if third_party_only else ""
        warnings.filterwarnings("ignore", message=message, category=category, module=origin)


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


_KNOWN_RECORDS = KnownRecordFilter()

MARK_ENV = "MEGATRON_BRIDGE_MARK_QUIET"
"""Set to ``1`` (by the harness): print the lines the quiet mode drops, marked, instead of dropping them."""

QUIET_MARK = "[quiet] "
"""Put in front of each line the quiet mode would drop, when :data:`MARK_ENV` is set."""

_LAUNCHER_LABEL = re.compile(r"^(\[default\d+\]:|\s*\d+: )")
"""The label a launcher puts before a rank's line: ``torchrun --tee`` ``[default<N>]:``, ``srun
--label`` ``<N>: ``."""


def marked(line: str) -> bool:
    """Whether a rank's line (with or without its launcher's label) is one the console leaves out."""
    label = _LAUNCHER_LABEL.match(line)
    return line[label.end() if label else 0 :].startswith(QUIET_MARK)


def unmarked(line: str) -> str:
    """``line`` as the rank would have printed it without the mark (the label kept)."""
    label = _LAUNCHER_LABEL.match(line)
    start = label.end() if label else 0
    if line[start:].startswith(QUIET_MARK):
        return line[:start] + line[start + len(QUIET_MARK) :]
    return line


def mark_lines(text: str) -> str:
    """``text`` with every line marked."""
    return "\n".join(QUIET_MARK + line for line in text.split("\n"))


def _under(name: str, roots: Iterable[str]) -> bool:
    return any(name == root or name.startswith(root + ".") for root in roots)


def dropped_when_quiet(record: logging.LogRecord, main_rank: bool) -> bool:
    """Whether the quiet mode drops ``record`` (the same tables as :func:`configure_logging` applies)."""
    if record.levelno >= logging.ERROR:
        return False
    if _under(record.name, SILENCED_LOGGERS):
        return True
    if record.levelno < logging.WARNING and _under(record.name, THIRD_PARTY_LOGGERS):
        return True
    if record.levelno < logging.WARNING and not main_rank and _under(record.name, ("megatron.bridge",)):
        return True
    return not _KNOWN_RECORDS.filter(record)


def known_warning(
    message: Warning | str, category: type[Warning], known: Iterable[tuple[type[Warning], str]] = KNOWN_WARNINGS
) -> bool:
    """Whether a warning is one :func:`silence_known_warnings` ignores (its filters match the start
    of the message, case-insensitively)."""
    text = str(message)
    return any(issubclass(category, cat) and re.match(pattern, text, re.I) for cat, pattern in known)


class MarkingFormatter(logging.Formatter):
    """Formats as ``inner`` does; marks every line of the records ``quiet`` selects."""

    def __init__(self, inner: logging.Formatter | None, quiet: Callable[[logging.LogRecord], bool]) -> None:
        super().__init__()
        self.inner, self.quiet = inner or logging.Formatter(), quiet

    def format(self, record: logging.LogRecord) -> str:
        text = self.inner.format(record)
        return mark_lines(text) if self.quiet(record) else text


def mark_quiet_output(*, main_rank: bool, fmt: str) -> None:
    """Print everything, marking what the quiet mode would drop (the rank side of :data:`MARK_ENV`)."""
    for handler in logging.getLogger().handlers:
        handler.setFormatter(MarkingFormatter(handler.formatter, lambda r: dropped_when_quiet(r, main_rank)))
    for name in SILENCED_LOGGERS:  # torch gives these its own handler: they get one of ours instead
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(MarkingFormatter(logging.Formatter(fmt), lambda r: r.levelno < logging.ERROR))
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.propagate = False
    show = warnings.showwarning

    def show_marked(message, category, filename, lineno, file=None, line=None):
        if not known_warning(message, category):
            return show(message, category, filename, lineno, file, line)
        text = warnings.formatwarning(message, category, filename, lineno, line).rstrip("\n")
        stream = file or sys.stderr
        try:
            stream.write(mark_lines(text) + "\n")
        except (OSError, AttributeError):
            pass

    warnings.showwarning = show_marked


def configure_logging(*, verbose: bool, rank: str, main_rank: bool) -> None:
    """Rank-prefixed logging; without ``verbose``: WARNING for third-party loggers, this package's
    INFO lines on the first rank only, known records dropped (marked instead, under the harness:
    :data:`MARK_ENV`)."""
    fmt = f"[rank {rank}] %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.INFO, format=fmt)
    if verbose:
        show_import_warnings()
        return
    if os.environ.get(MARK_ENV) == "1":
        show_import_warnings()
        mark_quiet_output(main_rank=main_rank, fmt=fmt)
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
