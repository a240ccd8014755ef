"""Two checkouts of the emulation benchmark in one call, interleaved: is a code change faster?

A change to the host's work (megatron-core's chunk sort, the emulated backend) moves an eager EP > 1
step by less than two machines, or two runs on one machine, differ. So the two codes run in the same
call on the same GPU, one repeat at a time, in alternating order (A B, B A, A B, ...), and the result
is the ratio of each pair of neighbours, never a figure from another call. Each repeat is one run of
``scripts/performance/ep_emulation_benchmark.py`` from that checkout (its ``src/`` first on the path),
so each code plans, validates and trains its own cases.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from megatron.bridge.perf.benchmarks.emulation_benchmark import row_key

BENCHMARK = Path("scripts") / "performance" / "ep_emulation_benchmark.py"
"""The benchmark each checkout runs, relative to its root."""
PACKAGE = Path("src") / "megatron" / "bridge"
"""What makes a directory a checkout of this project (its importable package)."""
OWN_FLAGS = ("--out", "--repeats", "--merge", "--publish", "--ran-at", "--note", "--leave-out")
"""Benchmark flags the A/B sets itself (or that would make a run something other than a run)."""


def interleaved_order(labels: tuple[str, str], repeats: int) -> list[tuple[int, str]]:
    """``(repeat, label)`` in the order they run: A B, then B A, then A B: neither code always runs first."""
    first, second = labels
    order = []
    for repeat in range(1, repeats + 1):
        pair = (first, second) if repeat % 2 else (second, first)
        order += [(repeat, label) for label in pair]
    return order


def run_name(label: str, repeat: int) -> str:
    return f"{label}_r{repeat}"


def problems(roots: Mapping[str, Path], labels: Sequence[str], repeats: int, bench_args: Sequence[str]) -> list[str]:
    """Everything wrong with an A/B's arguments, all at once, each with its fix."""
    found = []
    for label, root in roots.items():
        if not (root / BENCHMARK).is_file() or not (root / PACKAGE).is_dir():
            found.append(
                f"{label}: {root} holds no {BENCHMARK} and {PACKAGE}; give the root of a checkout or an export"
            )
    for label in labels:
        if not label.replace("_", "").replace("-", "").isalnum():
            found.append(f"label {label!r}: use letters, digits, '-' and '_' only (it names the run folders)")
    if len(set(labels)) != len(labels):
        found.append(f"labels {list(labels)}: the two codes need different labels")
    if repeats < 2:
        found.append(f"--repeats {repeats}: an A/B needs at least 2 (each code once first, once second)")
    for flag in OWN_FLAGS:
        if any(arg == flag or arg.startswith(flag + "=") for arg in bench_args):
            found.append(f"{flag} after '--': the A/B sets it for each run; leave it out")
    return found


def same_run_ratios(
    runs: Mapping[tuple[int, str], list[dict[str, Any]]], labels: tuple[str, str]
) -> list[dict[str, Any]]:
    """One row per case both codes ran: each code's step per repeat and, repeat by repeat, B's step over
    A's (the only comparison this result makes)."""
    first, second = labels
    repeats = sorted({repeat for repeat, _ in runs})
    steps: dict[tuple, dict[str, dict[int, float]]] = {}
    for (repeat, label), rows in runs.items():
        for row in rows:
            steps.setdefault(row_key(row), {}).setdefault(label, {})[repeat] = statistics.fmean(row["step_s"])
    out = []
    for key, by_label in sorted(steps.items()):
        paired = [r for r in repeats if r in by_label.get(first, {}) and r in by_label.get(second, {})]
        if not paired:
            continue
        ratios = [by_label[second][r] / by_label[first][r] for r in paired]
        ep, layers, micro_batches, network, dispatcher, arm = key
        out.append(
            {
                "ep": ep,
                "layers": layers,
                "micro_batches": micro_batches,
                "network": network,
                "dispatcher": dispatcher,
                "arm": arm,
                f"{first}_step_s": [by_label[first][r] for r in paired],
                f"{second}_step_s": [by_label[second][r] for r in paired],
                f"{second}_over_{first}": ratios,
                f"{second}_over_{first}_mean": statistics.fmean(ratios),
                f"{second}_faster_every_repeat": all(ratio < 1 for ratio in ratios),
            }
        )
    return out


def table(rows: Sequence[dict[str, Any]], labels: tuple[str, str]) -> str:
    """The ratios as a Markdown table."""
    first, second = labels
    lines = [
        f"| layers | arm | {first} (s) | {second} (s) | {second} / {first}, repeat by repeat |",
        "|---:|---|---:|---:|---|",
    ]
    for row in rows:
        a = ", ".join(f"{s:.3f}" for s in row[f"{first}_step_s"])
        b = ", ".join(f"{s:.3f}" for s in row[f"{second}_step_s"])
        ratios = ", ".join(f"{r:.3f}" for r in row[f"{second}_over_{first}"])
        lines.append(f"| {row['layers']} | {row['arm']} | {a} | {b} | {ratios} |")
    return "\n".join(lines)
