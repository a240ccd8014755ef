"""A graceful stop asked for by SIGTERM or SIGINT, honoured between two training steps.

The harness (or SLURM before a time limit, or torchrun tearing a job down) signals the ranks;
each rank only *records* the signal, finishes the step it is in, agrees with the other ranks on
stopping at the same iteration, saves once and exits 0. Killing a rank mid-step would leave
nothing saved, and a rank that dies alone leaves its peers blocked in a collective.

The entry point installs the handler first thing, before torch and megatron-core are imported,
so that a signal during start-up is honoured too (the ranks then stop before the first step).

The harness relays every stop to the ranks as SIGTERM (``srun`` forwards nothing else), whatever it
received; before it does, it writes the name of the signal it received (Ctrl-C: SIGINT, its terminal
closing: SIGHUP) into the file :data:`STOP_NOTE_ENV` names, and a rank reports a SIGTERM under that
signal (:func:`reported_signal`): the rank's line and ``summary.json``'s ``stop_reason`` say SIGINT
for a Ctrl-C. Without a note (SLURM's pre-timeout SIGTERM, torchrun, a user's ``kill``) a rank
reports the signal it got.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from typing import Any

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)
RELAYED_SIGNALS: tuple[signal.Signals, ...] = (*STOP_SIGNALS, signal.SIGHUP)
"""What a stop may be reported under: the ranks' stop signals, and SIGHUP (the harness's terminal
closed), which reaches the ranks as the harness's SIGTERM."""
STOP_SIGNAL_NAMES: frozenset[str] = frozenset(sig.name for sig in RELAYED_SIGNALS)
STOP_NOTE_ENV = "MEGATRON_BRIDGE_STOP_NOTE"
"""Environment variable naming the file in which the harness writes the signal it received, before it
relays the stop to the ranks as SIGTERM."""
_NOTE_MAX_CHARS = 16


def reported_signal(signum: int) -> int:
    """The signal a stop that arrived as ``signum`` is reported under: for a SIGTERM, the stop signal
    the harness's note names, when there is one; else ``signum`` itself."""
    path = os.environ.get(STOP_NOTE_ENV)
    if signum != signal.SIGTERM or not path:
        return signum
    try:
        with open(path, encoding="ascii", errors="replace") as note:
            name = note.read(_NOTE_MAX_CHARS).strip()
    except OSError:
        return signum
    return int(signal.Signals[name]) if name in STOP_SIGNAL_NAMES else signum


class StopRequest:
    """Records the first stop signal this process receives; reused by every ``pretrain`` call."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def received(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        """``SIGTERM``/``SIGINT``/``SIGHUP`` (empty when no signal arrived)."""
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = reported_signal(signum)

    def install(self) -> bool:
        """Route SIGTERM and SIGINT here; ``False`` outside the main thread (signals cannot be
        caught there, the process keeps its current handlers)."""
        if self._previous:
            return True
        try:
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread
            self._previous.clear()
            return False
        return True

    def uninstall(self) -> None:
        """Give the signals back to the handlers that were there before :meth:`install`."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    @contextlib.contextmanager
    def listening(self) -> Iterator[StopRequest]:
        """Catch stop signals inside the block; leaves handlers installed by someone else alone."""
        owned = not self._previous and self.install()
        try:
            yield self
        finally:
            if owned:
                self.uninstall()

    def clear(self) -> None:
        """Forget a handled stop (a library caller may train again in the same process)."""
        self.signum = None


STOP = StopRequest()
"""The process-wide stop request (signal handlers are process-wide too)."""
