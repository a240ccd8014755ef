"""What a rank's failure was, in one line a report can lead with: the error, what caused it, and
a full disk said in those words.

Some failures hide their cause: torch's ``CheckpointException`` derives from ``BaseException`` and
carries each rank's own exception in ``failures`` (a truncated shard reads as "checkpoint file is
corrupted" only there); megatron-core's checkpoint writer reports a worker's failed write as the
exception's class alone, so a full disk shows as "unexpected pos 704 vs 598" or "OSError". The
chain is followed (``__cause__``, ``__context__``, ``failures``), and where a save directory is
known, its free space decides whether the disk was full.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from pathlib import Path

MAX_CHAIN = 6
FULL_DISK_BYTES = 64 * 2**20
"""Free space under which a failed save is reported as a full disk."""


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if type(exc).__name__ == "CheckpointException":
        first = "a checkpoint load or save failed on some rank"
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps, outermost first, each once."""
    seen: set[int] = set()
    stack = [exc]
    while stack and len(seen) < MAX_CHAIN:
        current = stack.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        failures = getattr(current, "failures", None)
        if isinstance(failures, dict):
            stack += [
                pair[0]
                for pair in failures.values()
                if isinstance(pair, tuple) and pair and isinstance(pair[0], BaseException)
            ]
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                stack.append(linked)


def disk_full(exc: BaseException, save_dir: str | None) -> str | None:
    """``No space left on device on PATH (...)`` when the failure was a full disk, else ``None``."""
    chain = list(causes(exc))
    by_errno = any(getattr(e, "errno", None) == errno.ENOSPC for e in chain)
    by_text = any("No space left on device" in str(e) for e in chain)
    free = None
    if save_dir:
        existing = next((p for p in (Path(save_dir), *Path(save_dir).parents) if p.exists()), None)
        if existing is not None:
            free = shutil.disk_usage(existing).free
    # megatron's writer keeps only the class of a worker's failed write: an I/O failure with the save
    # directory (nearly) full is taken for what it most likely was
    io_failure = any(
        isinstance(e, OSError)
        or type(e).__name__ == "CheckpointException"
        or "unexpected pos" in str(e)
        or "Worker failure" in str(e)
        for e in chain
    )
    if by_errno or by_text or (io_failure and free is not None and free < FULL_DISK_BYTES):
        where = f" on {save_dir}" if save_dir else ""
        left = f" ({free / 2**20:.0f} MiB free)" if free is not None else ""
        return f"No space left on device{where}{left}"
    return None


def describe_failure(exc: BaseException, save_dir: str | None = None) -> str:
    """The error and its causes (``A <- caused by B``), a full disk first when it was one."""
    chain = [_one_line(e) for e in causes(exc)]
    text = " <- caused by ".join(dict.fromkeys(chain))
    full = disk_full(exc, save_dir)
    return f"{full}: {text}" if full else text
