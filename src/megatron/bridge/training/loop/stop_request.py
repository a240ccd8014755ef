"""A graceful stop asked for by SIGTERM or SIGINT, honoured between two training steps.

The harness (or SLURM before a time limit, or torchrun tearing a job down) signals the ranks;
each rank only *records* the signal, finishes the step it is in, agrees with the other ranks on
stopping at the same iteration, saves once and exits 0. Killing a rank mid-step would leave
nothing saved, and a rank that dies alone leaves its peers blocked in a collective.

The entry point installs the handler first thing, before torch and megatron-core are imported,
so that a signal during start-up is honoured too (the ranks then stop before the first step).
"""

from __future__ import annotations

import contextlib
import signal
from typing import Any, Iterator, Optional

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)
STOP_SIGNAL_NAMES: frozenset[str] = frozenset(sig.name for sig in STOP_SIGNALS)


class StopRequest:
    """Records the first stop signal this process receives; reused by every ``pretrain`` call."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self._previous: dict[int, Any] = {}

    @property
    def received(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        """``SIGTERM``/``SIGINT`` (empty when no signal arrived)."""
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum

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
    def listening(self) -> Iterator["StopRequest"]:
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
