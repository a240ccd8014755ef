"""What the emulated collectives of one step did: per group and kind, calls, bytes, the bytes that
crossed the inter-node link (each GPU's NIC) and modeled seconds.

The backend adds every collective it runs; the training loop takes the step's record after each
step (``summary.json`` keeps them all, the step line shows the modeled total). ``host_seconds`` is
what the emulation itself cost the host (inside the backend's methods), so a step time can be
checked for being bound by the emulation rather than by the work it emulates.

An exchange whose split sizes stay on the GPU is tallied there (:meth:`CommRecord.device_tally`:
the hold kernel adds its calls, bytes and modeled time); :meth:`CommRecord.take` reads those
tallies once a step, after the GPU has finished it. Such calls are not in ``order``.

Under a CUDA graph (``model.cuda_graph_impl=full_iteration``) the host issues a captured collective
once, at the capture, and the GPU runs it at every replay: a collective charged while its stream is
capturing is kept aside (:attr:`CommRecord.captured`) and added to the record each time the graph
replays (:meth:`CommRecord.replayed`). Device tallies need nothing: their kernels replay too.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Tally:
    calls: int = 0
    bytes: int = 0
    modeled_s: float = 0.0
    inter_node_bytes: int = 0
    host_s: float = 0.0
    """What these calls cost the host inside the backend."""

    def add(self, calls: int, nbytes: int, modeled_s: float, inter_node_bytes: int) -> None:
        self.calls += calls
        self.bytes += nbytes
        self.modeled_s += modeled_s
        self.inter_node_bytes += inter_node_bytes

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "bytes": self.bytes,
            "inter_node_bytes": self.inter_node_bytes,
            "modeled_s": self.modeled_s,
            "host_s": self.host_s,
        }


@dataclass
class CommRecord:
    """Collectives since the last :meth:`take`, by group label and kind."""

    tallies: dict[tuple[str, str], Tally] = field(default_factory=lambda: defaultdict(Tally))
    host_s: float = 0.0
    order: list[tuple[str, str, int]] = field(default_factory=list)
    """``(group, kind, bytes)`` of every collective in issue order (kept only when ``keep_order``, for
    tests that compare a step with a real world's, and then in each step's record)."""
    keep_order: bool = False
    last: Tally | None = None
    """The tally of the collective being run (its host time is added to it when it returns)."""
    device_tallies: dict[tuple[str, str], torch.Tensor] = field(default_factory=dict)
    """Per group and kind, int64 ``[calls, bytes, inter-node bytes, modeled ns]`` on the GPU."""
    captured: list[tuple[str, str, int, float, int]] = field(default_factory=list)
    """``(group, kind, bytes, modeled seconds, inter-node bytes)`` of each collective the CUDA graph of
    this run captured, in issue order: the graph runs them at every replay."""

    def device_tally(self, group: str, kind: str, device: torch.device) -> torch.Tensor:
        """The device-side tally a kernel adds a call of ``kind`` on ``group`` to (made at first use)."""
        key = (group, kind)
        tally = self.device_tallies.get(key)
        if tally is None or tally.device != device:
            self._fold_device()
            tally = self.device_tallies[key] = torch.zeros(4, dtype=torch.int64, device=device)
        self.last = self.tallies[key]
        return tally

    def _fold_device(self) -> None:
        """Add the device tallies to the host ones and zero them (waits for the GPU to finish)."""
        if not self.device_tallies:
            return
        for device in {t.device for t in self.device_tallies.values()}:
            torch.cuda.synchronize(device)
        for key, values in self.device_tallies.items():
            calls, nbytes, inter, nanoseconds = values.tolist()
            if calls:
                self.tallies[key].add(calls, nbytes, nanoseconds * 1e-9, inter)
                values.zero_()

    def add(
        self, group: str, kind: str, nbytes: int, modeled_s: float, inter_node_bytes: int = 0, capturing: bool = False
    ) -> None:
        """One collective issued; while a CUDA graph captures it, it is kept for the graph's replays."""
        if capturing:
            self.captured.append((group, kind, nbytes, modeled_s, inter_node_bytes))
            self.last = None
            return
        self._count(group, kind, nbytes, modeled_s, inter_node_bytes)

    def replayed(self) -> None:
        """The captured graph ran once: its collectives are this step's."""
        for charge in self.captured:
            self._count(*charge)

    def forget_capture(self) -> None:
        """A new graph will be captured (a new run): the previous graph's collectives are no longer run."""
        self.captured.clear()

    def _count(self, group: str, kind: str, nbytes: int, modeled_s: float, inter_node_bytes: int) -> None:
        tally = self.tallies[(group, kind)]
        tally.add(1, nbytes, modeled_s, inter_node_bytes)
        self.last = tally
        if self.keep_order:
            self.order.append((group, kind, nbytes))

    def take(self) -> dict[str, Any]:
        """This step's record (``{"groups": {group: {kind: {...}}}, "modeled_s", "host_s"}``), then empty."""
        self._fold_device()
        groups: dict[str, dict[str, Any]] = {}
        for (group, kind), tally in sorted(self.tallies.items()):
            groups.setdefault(group, {})[kind] = tally.as_dict()
        step: dict[str, Any] = {
            "groups": groups,
            "modeled_s": sum(t.modeled_s for t in self.tallies.values()),
            "host_s": self.host_s,
        }
        if self.keep_order:
            step["order"] = list(self.order)
        self.tallies.clear()
        self.order.clear()
        self.last = None
        self.host_s = 0.0
        return step


class HostTimer:
    """Adds the time spent inside a ``with`` block to ``record.host_s`` and to the tally of the
    collective the block recorded."""

    __slots__ = ("record", "start")

    def __init__(self, record: CommRecord) -> None:
        self.record = record

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        spent = time.perf_counter() - self.start
        self.record.host_s += spent
        if self.record.last is not None:
            self.record.last.host_s += spent
            self.record.last = None
