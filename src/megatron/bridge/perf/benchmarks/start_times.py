"""How long the harness takes to answer, for source trees compared in one run (the logic of
``scripts/performance/harness_start_times.py``).

Each command of :data:`COMMANDS` runs as a user runs it (``python scripts/performance/run_script.py
...``) with ``PYTHONPATH`` at one tree's ``src``, so two commits are compared on the same machine at
the same time. The trees alternate within every repeat (their order reversed every other repeat), so
a machine that gets busier or quieter touches each alike. Per command and tree the wall time and the
CPU time (user + system, of the process and its children) are kept; the median is reported, the
minimum beside it. A loaded machine stretches wall time much more than CPU time.

``import_breakdown`` runs the dry run once per tree under ``python -X importtime`` and sums the
import time by package: what the dry run spends importing torch, megatron-core, this package and
the rest.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

README_DRYRUN = (
    "-m",
    "qwen",
    "-mr",
    "qwen3_30b_a3b",
    "--task",
    "pretrain",
    "-g",
    "h100",
    "-c",
    "bf16",
    "-ng",
    "16",
    "-gn",
    "8",
    "--max_steps",
    "8",
    "--cuda_graph_impl",
    "none",
    "--moe_flex_dispatcher_backend",
    "None",
    "--moe_a2a_overlap",
    "false",
    "--tokenizer_type",
    "NullTokenizer",
    "comm_overlap.overlap_moe_expert_parallel_comm=true",
    "comm_overlap.delay_wgrad_compute=false",
    "model.moe_shared_expert_overlap=false",
    "--dryrun",
)
"""The README's Qwen3-30B-A3B command with ``--dryrun``."""

COMMANDS: dict[str, tuple[tuple[str, ...], int]] = {
    "help": (("--help",), 0),
    "unknown-flag": (("-mr", "qwen3_moe_tiny", "--max-step", "10"), 2),
    "unknown-recipe": (("-mr", "qwen3_moe_tinny", "-g", "cpu"), 2),
    "misspelt-override": (("-mr", "qwen3_moe_tiny", "-g", "cpu", "train.trian_iters=3"), 2),
    "readme-dryrun": (README_DRYRUN, 0),
}
"""name -> (harness arguments, the exit code it must end with)."""

REFERENCES: dict[str, str] = {
    "python -c pass": "pass",
    "python -c 'import torch'": "import torch",
    "python -c 'import megatron.core'": "import megatron.core",
}
"""What bounds the answers from below: the interpreter's start, torch's import, megatron-core's import
(every config class is a megatron-core dataclass, so a dry run imports it)."""


@dataclass
class Samples:
    """Wall and CPU seconds of the runs of one command on one tree."""

    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)

    def row(self) -> dict[str, float]:
        return {
            "median_wall_s": statistics.median(self.wall_s),
            "min_wall_s": min(self.wall_s),
            "median_cpu_s": statistics.median(self.cpu_s),
            "runs": len(self.wall_s),
        }


def timed(argv: Sequence[str], env: dict[str, str], cwd: Path) -> tuple[float, float, int, str]:
    """Run ``argv``; its wall and CPU seconds, exit code and output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(list(argv), env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.returncode, proc.stdout + proc.stderr


def tree_env(tree: Path) -> dict[str, str]:
    """The environment that makes ``python`` import ``megatron.bridge`` from ``tree/src``."""
    return {**os.environ, "PYTHONPATH": str(tree / "src")}


def harness_argv(tree: Path, arguments: Sequence[str]) -> list[str]:
    return [sys.executable, str(tree / "scripts" / "performance" / "run_script.py"), *arguments]


def measure(
    trees: dict[str, Path], repeats: int, commands: Sequence[str] = tuple(COMMANDS), references: bool = True
) -> dict[str, dict[str, Samples]]:
    """``{command: {tree label: Samples}}`` over ``repeats`` interleaved rounds of ``commands`` (names
    of :data:`COMMANDS`); a command that ends with another exit code than its own raises
    ``RuntimeError`` with its output."""
    results: dict[str, dict[str, Samples]] = {}
    labels = list(trees)
    with tempfile.TemporaryDirectory() as scratch:
        for round_number in range(repeats):
            order = labels if round_number % 2 == 0 else labels[::-1]
            for name in commands:
                arguments, expected = COMMANDS[name]
                for label in order:
                    wall, cpu, code, text = timed(
                        harness_argv(trees[label], arguments), tree_env(trees[label]), Path(scratch)
                    )
                    if code != expected:
                        raise RuntimeError(f"{name} on {label} ended with {code}, not {expected}:\n{text[-2000:]}")
                    sample = results.setdefault(name, {}).setdefault(label, Samples())
                    sample.wall_s.append(wall)
                    sample.cpu_s.append(cpu)
            if references:
                for name, code_text in REFERENCES.items():
                    wall, cpu, _, _ = timed(
                        [sys.executable, "-W", "ignore", "-c", code_text], dict(os.environ), Path(scratch)
                    )
                    sample = results.setdefault(name, {}).setdefault("reference", Samples())
                    sample.wall_s.append(wall)
                    sample.cpu_s.append(cpu)
    return results


IMPORT_GROUPS = ("megatron.core", "megatron.bridge", "torch")
"""The packages whose import time :func:`import_breakdown` sums apart (the rest is ``other``)."""


def import_breakdown(tree: Path) -> dict[str, float]:
    """Seconds the README's dry run spends importing, by package (``-X importtime``'s own times)."""
    with tempfile.TemporaryDirectory() as scratch:
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", *harness_argv(tree, README_DRYRUN)[1:]],
            env=tree_env(tree),
            cwd=scratch,
            capture_output=True,
            text=True,
        )
    totals: dict[str, float] = {}
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _, name = (part.strip() for part in line.removeprefix("import time:").split("|"))
        group = next((g for g in IMPORT_GROUPS if name == g or name.startswith(g + ".")), "other")
        totals[group] = totals.get(group, 0.0) + int(self_us) / 1e6
    totals["all imports"] = sum(totals.values())
    return totals


def markdown(results: dict[str, dict[str, Samples]], breakdown: dict[str, dict[str, float]] | None = None) -> str:
    """The numbers as the harness page shows them."""
    lines = ["| command | tree | median wall (s) | min wall (s) | median CPU (s) | runs |", "|---|---|---|---|---|---|"]
    for name, by_tree in results.items():
        for label, samples in by_tree.items():
            r = samples.row()
            lines.append(
                f"| `{name}` | {label} | {r['median_wall_s']:.2f} | {r['min_wall_s']:.2f} | "
                f"{r['median_cpu_s']:.2f} | {r['runs']} |"
            )
    if breakdown:
        groups = sorted({g for totals in breakdown.values() for g in totals})
        lines += [
            "",
            "| imports of the dry run (s, -X importtime) | " + " | ".join(groups) + " |",
            "|---|" + "---|" * len(groups),
        ]
        for label, totals in breakdown.items():
            lines.append(f"| {label} | " + " | ".join(f"{totals.get(g, 0.0):.2f}" for g in groups) + " |")
    return "\n".join(lines) + "\n"
