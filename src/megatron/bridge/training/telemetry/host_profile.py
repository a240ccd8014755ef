"""Where the host's time goes in a window of training steps: Python's deterministic profiler.

A step that leaves the GPU idle is bound by the host, and what binds it is usually thousands of short
calls a step (collectives, chunk sorts, kernel launches), which a sampling profiler can miss. cProfile
counts every call, C functions included (each torch op, each CUDA call), so the report says which
code the host's time went to and how often it was called. Its own overhead inflates Python-heavy
code: compare shares between runs of one window, not the profiled step's time with an unprofiled one.

``profiling.use_host_profiler`` turns it on for ``profile_step_start..profile_step_end`` on
``profile_ranks`` (:class:`~megatron.bridge.training.telemetry.profiling.StepProfiler`); the rank
writes ``host_rank<R>_steps<S>-<E>.pstats`` (``python -m pstats`` reads it) and a ``.txt`` report
beside the torch trace in ``<log_dir>/profile/``.
"""

from __future__ import annotations

import cProfile
import io
import marshal
import pstats
from collections import defaultdict
from pathlib import Path

from megatron.bridge.utils.owned_files import make_dir, replace_file

PACKAGES: tuple[tuple[str, str], ...] = (
    ("megatron/bridge/emulation/", "emulated world (backend, hold kernel)"),
    ("megatron/core/transformer/moe/", "megatron-core MoE (router, dispatcher, experts)"),
    ("megatron/core/", "megatron-core (other)"),
    ("megatron/bridge/", "megatron.bridge (other)"),
    ("/triton/", "Triton (kernel launches)"),
    ("/torch/", "torch (Python)"),
)
"""Path fragments whose functions' own time is summed together, first match wins."""
C_FUNCTIONS = "C functions (torch ops, CUDA calls, builtins)"
TOP = 40
"""Functions listed in each order of the report."""


def package_of(filename: str) -> str:
    """The group of :data:`PACKAGES` a function defined in ``filename`` belongs to (cProfile names a C
    function's file ``~``)."""
    if filename == "~":
        return C_FUNCTIONS
    path = filename.replace("\\", "/")
    return next((name for fragment, name in PACKAGES if fragment in path), "other Python")


def by_package(stats: pstats.Stats) -> dict[str, float]:
    """Own time in seconds summed by :func:`package_of`, largest first."""
    totals: dict[str, float] = defaultdict(float)
    for (filename, _line, _name), row in stats.stats.items():  # type: ignore[attr-defined]
        totals[package_of(filename)] += row[2]
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def report(stats: pstats.Stats, steps: int, top: int = TOP) -> str:
    """Own time by package (in all and per step), then the ``top`` functions by own and by cumulative time."""
    packages = by_package(stats)
    total = sum(packages.values()) or 1.0
    out = io.StringIO()
    out.write(f"host time of {steps} step(s) under cProfile, own time by package\n")
    for name, seconds in packages.items():
        out.write(
            f"  {seconds:9.3f} s  {seconds / max(1, steps):8.4f} s/step  {100 * seconds / total:5.1f} %  {name}\n"
        )
    stats.stream = out  # type: ignore[attr-defined]
    for order in ("tottime", "cumulative"):
        out.write(f"\n--- the {top} functions with the most {order} ---\n")
        stats.sort_stats(order).print_stats(top)
    return out.getvalue()


class HostProfile:
    """One capture: :meth:`start`, :meth:`stop`, then :meth:`write` the pstats file and the report."""

    def __init__(self) -> None:
        self._profiler = cProfile.Profile(builtins=True)

    def start(self) -> None:
        self._profiler.enable()

    def stop(self) -> None:
        self._profiler.disable()

    def write(self, pstats_path: Path, steps: int) -> Path:
        """The profile at ``pstats_path`` and its report beside it (``.txt``); the report's path."""
        make_dir(pstats_path.parent, parents=True)
        stats = pstats.Stats(self._profiler)
        text_path = pstats_path.with_suffix(".txt")
        replace_file(text_path, report(stats, steps))
        # The bytes pstats' own dump_stats would write, through replace_file (never through a link).
        replace_file(pstats_path, marshal.dumps(stats.stats))  # type: ignore[attr-defined]
        return text_path
