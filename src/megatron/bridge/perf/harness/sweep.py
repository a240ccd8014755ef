"""One-knob A/B sweeps: ``--sweep dotted.key=v1,v2,...`` (``--sweep_repeats N`` for N rounds).

Every value runs as its own job with everything else fixed (one sub-directory of the log directory
per value and round); afterwards ``sweep.md`` (mean/min/max step time, speedup against the first
value) and ``sweep.png`` (bars with min-max whiskers) are written next to them. With several
rounds the values run interleaved (v1, v2, v1, v2, ...), so a drift of the machine over time
touches every value alike, and the table shows each round's mean and their spread.

A sweep in CPU smoke mode shows that every value runs, and its step times, but no speedup: on a CPU
the compute and gloo's communication share a few cores with whatever else runs on the host, so its
timings rank nothing (a CPU sweep once put a "2.039x" overlap speedup into the table). An emulated
sweep (``--emulate``) says so, names its network, and shows the modeled communication per step
beside the step times: those are one process's compute plus modeled seconds, not a measurement.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from megatron.bridge.perf.harness.argument_parser import TOP_LEVEL_KEYS
from megatron.bridge.perf.harness.results import SteadyState
from megatron.bridge.utils.owned_files import replace_file
from megatron.bridge.utils.plots import fit_width, pyplot, save_png


@dataclass(frozen=True)
class SweepSpec:
    """One dotted key and the raw values to try (in order; the first is the baseline)."""

    key: str
    values: tuple[str, ...]

    def override(self, value: str) -> str:
        return f"{self.key}={value}"


def split_values(text: str) -> list[str]:
    """Split ``a,b,[1,2]`` on commas outside brackets/quotes (list values stay whole)."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    quote: str | None = None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    parts.append("".join(current).strip())
    return parts


def parse_sweep(text: str) -> SweepSpec:
    """``key=v1,v2,...`` -> :class:`SweepSpec`; at least two distinct values are required."""
    key, sep, rest = text.partition("=")
    key = key.strip()
    if not sep or not (re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", key) or key in TOP_LEVEL_KEYS):
        raise ValueError(f"--sweep expects dotted.key=v1,v2,...; got {text!r}")
    values = split_values(rest)
    if any(v == "" for v in values):
        raise ValueError(f"--sweep has an empty value in {text!r}")
    if len(values) < 2 or len(set(values)) != len(values):
        raise ValueError(f"--sweep needs at least two distinct values; got {values}")
    return SweepSpec(key, tuple(values))


def job_dirname(spec: SweepSpec, index: int, value: str, round_number: int | None = None) -> str:
    """A filesystem-safe sub-directory per value (and round, when there are several), ordered by position."""
    safe = re.sub(r"[^A-Za-z0-9_.+-]+", "_", value).strip("_") or "value"
    name = f"{index:02d}_{spec.key.rsplit('.', 1)[-1]}={safe}"
    return name if round_number is None else f"{name}_r{round_number}"


@dataclass(frozen=True)
class SweepPoint:
    """Outcome of one value: its steady-state statistics, or why there are none.

    With several rounds, ``rounds`` holds each round's statistics (``None`` for a failed one) and
    ``stats`` combines them: the mean of the round means, the extremes of all steps.
    """

    value: str
    log_dir: str
    stats: SteadyState | None
    exit_code: int = 0
    rounds: tuple[SteadyState | None, ...] = ()

    def round_means(self) -> list[float]:
        return [r.mean_s for r in self.rounds if r is not None]


def combine_rounds(
    value: str, log_dirs: Sequence[str], rounds: Sequence[SteadyState | None], exit_codes: Sequence[int]
) -> SweepPoint:
    """One value's point from its rounds (a failed round keeps its exit code in the point)."""
    done = [r for r in rounds if r is not None]
    stats = None
    if done:
        comm = [r.modeled_comm_s for r in done if r.modeled_comm_s is not None]
        stats = SteadyState(
            first=done[0].first,
            last=done[0].last,
            mean_s=sum(r.mean_s for r in done) / len(done),
            min_s=min(r.min_s for r in done),
            max_s=max(r.max_s for r in done),
            count=sum(r.count for r in done),
            first_iteration=done[0].first_iteration,
            last_iteration=done[0].last_iteration,
            rule=done[0].rule,
            modeled_comm_s=sum(comm) / len(comm) if comm else None,
            emulated_network=done[0].emulated_network,
        )
    code = next((c for c in exit_codes if c != 0), 0)
    log_dir = log_dirs[0] if len(log_dirs) == 1 else ", ".join(log_dirs)
    return SweepPoint(value, log_dir, stats, code, tuple(rounds) if len(rounds) > 1 else ())


def _table_row(cells: Sequence[str]) -> str:
    return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"


CPU_TIMINGS_NOTE = (
    "CPU smoke mode: these step times show that every value runs; they rank nothing. On a CPU the compute and "
    "gloo's communication share a few cores with whatever else runs on the host, so no speedup is given: "
    "compare the values on GPUs."
)
"""What a CPU sweep's ``sweep.md`` says instead of a speedup."""

ONE_ROUND_NOTE = (
    "One round per value: a drift of the machine between the jobs can decide the order. For a number to "
    "quote, run at least two interleaved rounds (--sweep_repeats 2) of 12 steps or more."
)


EMULATED_CPU_NOTE = (
    "CPU smoke mode: the compute ran on a CPU shared with whatever else runs on the host, so these step times "
    "rank nothing and no speedup is given: compare the values emulated on a GPU."
)
"""What an emulated CPU sweep says instead of a speedup (no gloo collective ran: the communication was modeled)."""


def emulated_network(points: Sequence[SweepPoint]) -> str | None:
    """The network model of an emulated sweep (``None`` for a measured one)."""
    return next((p.stats.emulated_network for p in points if p.stats and p.stats.emulated_network), None)


def emulated_note(network: str) -> str:
    return (
        f"EMULATED world on network '{network}': each job was one process playing one rank; its step times are "
        "that process's compute plus the time the network model gave each collective (modeled, not measured). "
        "modeled comm (s): the modeled part of a step, mean over the same steps."
    )


def _notes(points: Sequence[SweepPoint], rounds: int, cpu: bool) -> list[str]:
    """What the table's numbers cannot say, as paragraphs under its heading."""
    network = emulated_network(points)
    notes = [emulated_note(network)] if network else []
    notes += [EMULATED_CPU_NOTE if network else CPU_TIMINGS_NOTE] if cpu else []
    if rounds < 2 and any(p.stats is not None for p in points):
        notes.append(ONE_ROUND_NOTE)
    return [line for note in notes for line in (note, "")]


def sweep_markdown(spec: SweepSpec, points: Sequence[SweepPoint], command: str = "", cpu: bool = False) -> str:
    """The ``sweep.md`` table: mean/min/max and speedup against the first value (with several
    rounds also each round's mean and their spread); a CPU sweep (``cpu``) gives no speedup."""
    base = points[0].stats.mean_s if points and points[0].stats else None
    window = next((p.stats.label().removeprefix("iterations ") for p in points if p.stats), "n/a")
    rounds = max((len(p.rounds) for p in points), default=0)
    how = f"Steady-state step time over iterations {window}"
    if rounds > 1:
        how += (
            f", {rounds} rounds run interleaved; mean = mean of the round means, min/max over all steps, "
            "spread = largest minus smallest round mean"
        )
    network = emulated_network(points)
    columns = [
        spec.key,
        "mean (s)",
        "min (s)",
        "max (s)",
        *(["modeled comm (s)"] if network else []),
        f"speedup vs `{spec.values[0]}`",
    ]
    columns += ["round means (s)", "spread (s)", "runs"] if rounds > 1 else ["run"]
    heading = f"# Sweep of `{spec.key}`" + (f" (EMULATED, network '{network}')" if network else "")
    lines = [
        heading,
        "",
        f"{how}; speedup = first value's mean / this mean.",
        "",
        *_notes(points, rounds, cpu),
        _table_row(columns),
        "|" + "---|" * len(columns),
    ]
    for p in points:
        if p.stats is None:
            cells = [f"`{p.value}`", f"failed (exit {p.exit_code})"] + [""] * (len(columns) - 3)
        else:
            speed = "n/a (CPU)" if cpu else f"{base / p.stats.mean_s:.3f}x" if base and p.stats.mean_s else "n/a"
            comm = [_seconds(p.stats.modeled_comm_s)] if network else []
            cells = [
                f"`{p.value}`",
                f"{p.stats.mean_s:.4f}",
                f"{p.stats.min_s:.4f}",
                f"{p.stats.max_s:.4f}",
                *comm,
                speed,
            ]
            if rounds > 1:
                means = p.round_means()
                cells += [
                    " / ".join(f"{r.mean_s:.4f}" if r is not None else "failed" for r in p.rounds),
                    f"{max(means) - min(means):.4f}",
                ]
        lines.append(_table_row(cells + [f"`{p.log_dir}`"]))
    if command:
        lines += ["", "Command:", "", "```bash", command, "```"]
    return "\n".join(lines) + "\n"


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _title(spec: SweepSpec, points: Sequence[SweepPoint], cpu: bool) -> str:
    """The plot's title: the swept key, broken at its dots when long, and what the times are."""
    key = "\n".join(textwrap.wrap(spec.key.replace(".", ". "), 48)).replace(". ", ".")
    network = emulated_network(points)
    kinds = [f"EMULATED on network '{network}': step times hold MODELED communication (hatched)"] if network else []
    kinds += ["CPU smoke mode: these times rank nothing"] if cpu else []
    return "\n".join([f"Sweep of {key}", *kinds])


def sweep_figure(spec: SweepSpec, points: Sequence[SweepPoint], cpu: bool = False) -> object | None:
    """The bar chart of mean step time with min-max whiskers, each bar's mean written above its
    whisker, an emulated sweep's modeled communication hatched inside the bar; ``None`` without
    matplotlib. The figure is widened until its title and labels fit."""
    plt = pyplot()
    if plt is None:
        return None
    done = [(p.value, p.stats) for p in points if p.stats is not None]
    fig, ax = plt.subplots(figsize=(max(4.8, 1.4 * len(points) + 2), 3.8))
    if done:
        names, means = [value for value, _ in done], [stats.mean_s for _, stats in done]
        # clamp: a float mean of equal values can sit a hair outside [min, max]
        lower = [max(0.0, stats.mean_s - stats.min_s) for _, stats in done]
        upper = [max(0.0, stats.max_s - stats.mean_s) for _, stats in done]
        ax.bar(names, means, yerr=[lower, upper], capsize=6, color="#4c72b0")
        comm = [stats.modeled_comm_s for _, stats in done]
        if all(c is not None for c in comm):
            ax.bar(names, comm, color="#4c72b0", edgecolor="white", hatch="//", lw=0, label="modeled communication")
            ax.legend(fontsize=8, loc="lower right")
        tops = [m + u for m, u in zip(means, upper)]
        for x, (mean, top) in enumerate(zip(means, tops)):
            ax.annotate(
                f"{mean:.3f}s",
                (x, top),
                ha="center",
                va="bottom",
                fontsize=8,
                xytext=(0, 4),
                textcoords="offset points",
            )
        ax.set_ylim(0, max(tops) * 1.22 or 1.0)  # room above the highest whisker for its label
    ax.set_xlabel(spec.key)
    ax.set_ylabel("step time (s), mean with min-max")
    title = fig.suptitle(_title(spec, points, cpu), fontsize=10)
    fit_width(fig, [title, ax.xaxis.label])
    return fig


def sweep_plot(spec: SweepSpec, points: Sequence[SweepPoint], path: str | Path, cpu: bool = False) -> Path | None:
    """:func:`sweep_figure` written as a PNG at ``path``; ``None`` when matplotlib is missing."""
    fig = sweep_figure(spec, points, cpu)
    return None if fig is None else save_png(fig, path)


def write_sweep_outputs(
    spec: SweepSpec, points: Sequence[SweepPoint], log_dir: str | Path, command: str = "", cpu: bool = False
) -> tuple[Path, Path | None]:
    """Write ``sweep.md`` and ``sweep.png`` into ``log_dir`` (the sweep's own directory, claimed
    by the harness; each replaces a link at its name instead of writing through it); ``cpu``: a CPU
    smoke-mode sweep (no speedup, see :data:`CPU_TIMINGS_NOTE`)."""
    log_dir = Path(log_dir)
    md = log_dir / "sweep.md"
    replace_file(md, sweep_markdown(spec, points, command, cpu))
    png = sweep_plot(spec, points, log_dir / "sweep.png", cpu)
    return md, png
