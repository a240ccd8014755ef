"""The values a user passes that the harness writes into a batch script or a command line, checked
before anything is written or launched.

A value copied into an ``#SBATCH`` line is read by ``sbatch`` and, after a newline, by the shell: a
newline in ``--account`` would add a command to the script (and end sbatch's reading of the
``#SBATCH`` lines, silently dropping the ones after it). So each value has a rule of what it may
hold (:data:`VALUE_RULES`); every value that breaks its rule is reported at once, with the flag, the
value and the fix; what passes is also quoted where it is written (``launcher.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from megatron.bridge.perf.harness.run_dir import run_dir_problems

_NAME = r"[A-Za-z0-9_.+-]+"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class ValueRule:
    """What one launch value may hold."""

    flag: str
    pattern: str
    allowed: str
    example: str

    def problem(self, value: str | None) -> str | None:
        """Why ``value`` cannot be written (``None``: it can, or it is not set)."""
        if value is None or re.fullmatch(self.pattern, value):
            return None
        return (
            f"{self.flag} {value!r}: {self.allowed} (it is written into the batch script); "
            f"fix: give e.g. {self.example}"
        )


VALUE_RULES: dict[str, ValueRule] = {
    "account": ValueRule("--account", _NAME, "a SLURM account is letters, digits and . _ + -", "--account my_project"),
    "partition": ValueRule(
        "--partition",
        rf"{_NAME}(,{_NAME})*",
        "a SLURM partition (or a comma-separated list) is letters, digits and . _ + -",
        "--partition batch",
    ),
    "time_limit": ValueRule(
        "--time",
        r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}",
        "a SLURM time limit is MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS",
        "--time 02:00:00",
    ),
}


def log_dir_problems(log_dir: Path, written_to_batch_script: bool) -> list[str]:
    """Why the run directory cannot be used: a control character, characters ``sbatch`` would read
    as part of its ``--output`` pattern, or what ``run_dir.run_dir_problems`` finds (a file in its
    place, another tool's or user's directory, links in it, another harness using it)."""
    text = str(log_dir)
    if _CONTROL.search(text):
        return [
            f"-l/logger.log_dir {text!r}: a run directory with a newline or other control character "
            "cannot be written into a launch command; fix: choose a plain path"
        ]
    if written_to_batch_script and re.search(r'[%"\\]', text):
        return [
            f"-l/logger.log_dir {text!r}: sbatch reads % as a file-name pattern and the path is quoted in "
            '"#SBATCH --output"; fix: choose a run directory without %, " or \\'
        ]
    return [
        f"{problem}; fix: give a new directory, or one this harness made (it is created if missing)"
        for problem in run_dir_problems(log_dir)
    ]


def launch_problems(
    *,
    account: str | None,
    partition: str | None,
    time_limit: str | None,
    log_dir: Path,
    written_to_batch_script: bool,
) -> list[str]:
    """Every problem of the launch values at once (empty: all can be written)."""
    values = dict(account=account, partition=partition, time_limit=time_limit)
    problems = [p for key, rule in VALUE_RULES.items() if (p := rule.problem(values[key]))]
    return problems + log_dir_problems(log_dir, written_to_batch_script)
