"""The Results table a run ends with, from its ``summary.json``: printed by the harness after a job,
and by ``pretrain()`` itself in a user's own script (rank 0, when no harness reports for it).

The table says what its numbers are. A CPU smoke-mode run's rates are no GPU figures; an emulated
run (``--emulate``) played one rank of a world whose communication the named network model timed,
so its step times hold modeled seconds (shown apart), and its tokens/s is the whole world's,
derived from one process's step. The steady-state window is labelled with the rule that chose it
(``steady_window.py``). Nothing here imports torch.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron.bridge.training.telemetry.steady_window import SteadyWindow

HARNESS_REPORTS_ENV = "MEGATRON_BRIDGE_HARNESS_REPORTS"
"""Set to ``1`` by the harness for the ranks it launches and watches: it prints the Results table
itself, so the logging rank only says where its summary is."""


def harness_reports() -> bool:
    """Whether the harness prints this run's Results table (else the logging rank does)."""
    return os.environ.get(HARNESS_REPORTS_ENV) == "1"


@dataclass(frozen=True)
class SteadyState:
    """Step-time statistics (seconds) over the run's steps ``first..last`` (1-based, inclusive).

    Steps count from the start of this run; after a resume they are not the iteration numbers,
    which ``first_iteration``/``last_iteration`` hold when the summary lists them. An emulated run
    also has the modeled communication per step over the same steps and its network's name.
    """

    first: int
    last: int
    mean_s: float
    min_s: float
    max_s: float
    count: int
    first_iteration: int | None = None
    last_iteration: int | None = None
    rule: str | None = None
    """How the window was chosen (``summary.json``'s ``steady_state_rule``)."""
    modeled_comm_s: float | None = None
    emulated_network: str | None = None

    def label(self) -> str:
        """``iterations 8-13 (steps 3-8 of this run)`` after a resume, ``iterations 3-8`` otherwise."""
        first_it = self.first if self.first_iteration is None else self.first_iteration
        last_it = self.last if self.last_iteration is None else self.last_iteration
        text = f"iterations {first_it}-{last_it}"
        if (first_it, last_it) != (self.first, self.last):
            text += f" (steps {self.first}-{self.last} of this run)"
        return text


def steady_state(
    step_times_s: Sequence[float], window: Sequence[int], iterations: Sequence[int] = ()
) -> SteadyState | None:
    """Statistics over the window, clipped to the steps that ran; ``None`` when none did.

    ``iterations`` (the summary's iteration numbers, one per step) labels the window.
    """
    first, last = int(window[0]), int(window[1])
    chosen = list(step_times_s[first - 1 : last])
    if not chosen:
        return None
    last = first + len(chosen) - 1
    return SteadyState(
        first,
        last,
        statistics.fmean(chosen),
        min(chosen),
        max(chosen),
        len(chosen),
        *_iteration_numbers(iterations, first, last),
    )


def _iteration_numbers(iterations: Sequence[int], first: int, last: int) -> tuple[int | None, int | None]:
    if len(iterations) < last:
        return None, None
    return int(iterations[first - 1]), int(iterations[last - 1])


def summary_steady_state(summary: dict[str, Any], window: Sequence[int] | None = None) -> SteadyState | None:
    """The summary's own steady-state numbers for its window, or recomputed for ``window`` (the
    harness's ``--steady_state_window``); with the emulated run's modeled communication."""
    written = summary.get("steady_state_window")
    times = summary.get("step_times_s") or []
    iterations = summary.get("iterations") or []
    rule = summary.get("steady_state_rule")
    if window is not None and (written is None or list(written) != list(window)):
        rule = f"--steady_state_window {window[0]},{window[1]}"
    elif written is None:  # a summary without a window: the automatic rule
        chosen, rule = SteadyWindow().choose(len(times))
        window = chosen or (1, 1)
    window = list(window or written)
    if written is not None and list(written) == window and summary.get("steady_state_mean_s") is not None:
        count = len(times[window[0] - 1 : window[1]]) or (window[1] - window[0] + 1)
        last = window[0] + count - 1
        stats = SteadyState(
            window[0],
            last,
            float(summary["steady_state_mean_s"]),
            float(summary.get("steady_state_min_s", summary["steady_state_mean_s"])),
            float(summary.get("steady_state_max_s", summary["steady_state_mean_s"])),
            count,
            *_iteration_numbers(iterations, window[0], last),
        )
    else:
        stats = steady_state(times, window, iterations)
    if stats is None:
        return None
    return SteadyState(**{**stats.__dict__, "rule": rule, **_modeled(summary, stats.first, stats.last)})


def _modeled(summary: dict[str, Any], first: int, last: int) -> dict[str, Any]:
    """An emulated run's network and mean modeled communication per step over ``first..last``."""
    network = emulated_network(summary)
    comm = ((summary.get("extra") or {}).get("modeled_comm_s") or [])[first - 1 : last]
    return dict(emulated_network=network, modeled_comm_s=statistics.fmean(comm) if network and comm else None)


def emulated_network(summary: dict[str, Any]) -> str | None:
    """The network preset an emulated run's communication was modeled by; ``None`` for a real run."""
    emulation = summary.get("emulation") or {}
    return (emulation.get("network") or {}).get("name") if emulation.get("emulated") else None


def _fmt(value: Any, pattern: str) -> str:
    return "n/a" if value is None else pattern.format(value)


def _tflops(value: float | None) -> str:
    """One decimal for real rates, two significant digits below one (a tiny model's 0.0021)."""
    return "n/a" if value is None else f"{value:.1f}" if value >= 1 else f"{value:.2g}"


def run_kind(summary: dict[str, Any]) -> str:
    """A few words on what the run's times are, for a plot's title."""
    network = emulated_network(summary)
    if network is not None:
        return f"EMULATED world of {summary.get('world_size')} on network '{network}': communication MODELED"
    if summary.get("device") == "cpu":
        return "CPU smoke mode: correctness only, never quote these times"
    return f"measured on {summary.get('world_size')} GPU(s)"


def _run_row(summary: dict[str, Any]) -> str:
    """What kind of run the numbers come from."""
    world, cpu = summary.get("world_size"), summary.get("device") == "cpu"
    network = emulated_network(summary)
    if network is not None:
        rank = (summary.get("emulation") or {}).get("rank", 0)
        where = "on the CPU" if cpu else "on one GPU"
        return (
            f"EMULATED world of {world} GPUs on network '{network}': one process {where} ran rank {rank}'s "
            "work; communication times MODELED, not measured" + ("; CPU compute: never quote" if cpu else "")
        )
    if cpu:
        return f"CPU smoke mode, {world} process(es) over gloo: correctness only, never quote these times"
    return f"measured on {world} GPU(s)"


def _rate_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """tokens/s and TFLOP/s per GPU, each saying what it is where it is not a measured GPU rate."""
    tokens, tflops = summary.get("tokens_per_s"), summary.get("tflops_per_gpu")
    world, cpu = summary.get("world_size"), summary.get("device") == "cpu"
    cpu_tflops = f"n/a: CPU smoke mode ({_tflops(tflops)} per process, on the CPU)"
    if emulated_network(summary) is not None:
        return [
            (
                "tokens/s (whole world)",
                _fmt(tokens, "{:,.0f}") + f": the emulated world of {world}, from one process's step time (modeled)",
            ),
            ("TFLOP/s/GPU", cpu_tflops if cpu else f"{_tflops(tflops)} (modeled: at the emulated step time)"),
        ]
    if cpu:
        return [("tokens/s", _fmt(tokens, "{:,.0f}") + " (CPU smoke mode: no GPU figure)"), ("TFLOP/s/GPU", cpu_tflops)]
    return [("tokens/s", _fmt(tokens, "{:,.0f}")), ("TFLOP/s/GPU", _tflops(tflops))]


def _comm_rows(summary: dict[str, Any], ss: SteadyState | None) -> list[tuple[str, str]]:
    """An emulated run's modeled communication: per step over the window, and the run's total."""
    comm = (summary.get("extra") or {}).get("modeled_comm_s") or []
    if emulated_network(summary) is None or not comm:
        return []
    per_step = _fmt(ss.modeled_comm_s if ss else None, "{:.4f} s per step over the window")
    return [("modeled communication", f"{per_step} ({sum(comm):.4f} s over the run's {len(comm)} steps)")]


def format_results(summary: dict[str, Any], summary_path: str | Path, window: Sequence[int] | None = None) -> str:
    """The small table printed at the end of a run."""
    ss = summary_steady_state(summary, window)
    if ss is None:
        window_text, mean, lo, hi = "n/a", None, None, None
        window_text += f" (only {len(summary.get('step_times_s') or [])} iterations ran)"
    else:
        window_text, mean, lo, hi = ss.label(), ss.mean_s, ss.min_s, ss.max_s
        window_text += f" ({ss.rule})" if ss.rule else ""
    cpu = summary.get("device") == "cpu"
    rows = [
        ("run", _run_row(summary)),
        ("steady-state window", window_text),
        ("step time mean", _fmt(mean, "{:.4f} s")),
        ("step time min", _fmt(lo, "{:.4f} s")),
        ("step time max", _fmt(hi, "{:.4f} s")),
        *_comm_rows(summary, ss),
        *_rate_rows(summary),
        ("peak memory", _fmt(summary.get("peak_memory_gib"), "{:.2f} GiB") + (" (process RSS)" if cpu else "")),
        (
            "world size",
            _fmt(summary.get("world_size"), "{}") + (" (emulated: 1 process)" if emulated_network(summary) else ""),
        ),
        ("final loss", _fmt((summary.get("losses") or [None])[-1], "{:.4f}")),
        ("summary", str(summary_path)),
    ]
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 40)
    body = "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
    return f"{line}\nResults\n{line}\n{body}\n{line}"
