"""A run's results as the harness reads them: ``summary.json`` (written by the training loop on the
logging rank) and the end-of-run table made from it.

The table and its steady-state statistics are the training side's (``telemetry/results_table.py``),
so that a user's own ``pretrain()`` script ends with the same table; the window is the one the
summary records (``telemetry/steady_window.py``: automatic unless ``logger.steady_state_window`` is
set) or, with ``--steady_state_window``, recomputed from ``step_times_s``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from megatron.bridge.training.harness_surface import (
    SteadyState,
    format_results,
    steady_state,
    summary_steady_state,
)

SUMMARY_NAME = "summary.json"

__all__ = [
    "SUMMARY_NAME",
    "SteadyState",
    "argv_without",
    "format_results",
    "load_summary",
    "steady_state",
    "summary_steady_state",
]


def load_summary(path: str | Path) -> dict[str, Any]:
    """Read ``summary.json`` (``path`` may be the file or the run directory)."""
    path = Path(path)
    if path.is_dir():
        path = path / SUMMARY_NAME
    return json.loads(path.read_text())


def argv_without(argv: Sequence[str], option: str) -> list[str]:
    """``argv`` with ``option`` and its value left out (``--opt V`` and ``--opt=V`` forms).

    Benchmark records keep the command that reproduces a measurement; options that only say where
    to write (an output path) or what to label it would make it name this machine's paths.
    """
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            kept.append(arg)
    return kept
