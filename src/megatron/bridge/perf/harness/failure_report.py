"""Which rank failed first, and why: the report the harness prints when a job fails.

When one rank dies, its peers fail right after it, inside a collective ("Connection reset by
peer"), or are stopped by the launcher; the report must lead with the rank that started it.
The facts come from two sources:

* each rank's own failure record (``<log_dir>/failures/rank_<N>.json``, written by the entry
  point: the error and the time it happened), absent when a rank was killed or crashed;
* the launcher's own output: ``torchrun`` lists every failed rank with its exit code and pid, and
  says which processes it sent a closing signal after the first failure; ``srun`` names the tasks
  that were killed or exited non-zero.

Ranks are ordered: first those that failed on their own (an error that is not a lost peer), then
those that died without a record while nobody was tearing the job down (killed, crashed), then the
ones that lost a peer or were stopped by the launcher; within each group by the time of failure.
"""

from __future__ import annotations

import json
import math
import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from megatron.bridge.perf.harness.supervisor import LAUNCH_LOG, is_rank_line
from megatron.bridge.training.harness_surface import FAILURE_DIR

TAIL_LINES = 30

PEER_LOSS_MARKERS: tuple[str, ...] = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "NCCL communicator was aborted",
    "remote process exited",
    "Socket Timeout",
    "DistNetworkError",
)
"""Error texts of a rank whose collective failed because another rank was gone."""

_TORCHRUN_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_TORCHRUN_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")
_TORCHRUN_CLOSING = re.compile(r"Sending process (\d+) closing signal")
_SRUN_TASKS = re.compile(r"srun: error: \S+: tasks? ([\d,\-]+): (.*)")


@dataclass
class RankFailure:
    """One failed rank, as far as the records and the launcher tell."""

    rank: int
    exit_code: int | None = None
    pid: int | None = None
    error: str | None = None
    time: float | None = None
    stopped_by_launcher: bool = False

    @property
    def lost_a_peer(self) -> bool:
        return self.error is not None and any(marker in self.error for marker in PEER_LOSS_MARKERS)

    @property
    def group(self) -> int:
        """0: failed on its own; 1: died without a record (killed, crashed); 2: a consequence."""
        if self.error is not None:
            return 2 if self.lost_a_peer else 0
        return 2 if self.stopped_by_launcher else 1

    def how(self) -> str:
        """``exit code -9 (killed by SIGKILL)`` / ``exit code 1: RuntimeError: ...``."""
        code = "exit code unknown" if self.exit_code is None else f"exit code {self.exit_code}"
        if self.exit_code is not None and self.exit_code < 0:
            code += f" (killed by {_signal_name(-self.exit_code)})"
        error = self.error if self.error is None or len(self.error) <= 200 else self.error[:197] + "..."
        return f"{code}: {error}" if error else code


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def read_records(log_dir: Path) -> dict[int, dict]:
    """The ranks' own failure records, by rank."""
    records = {}
    for path in sorted((log_dir / FAILURE_DIR).glob("rank_*.json")):
        try:
            record = json.loads(path.read_text())
            records[int(record["rank"])] = record
        except (OSError, ValueError, KeyError):
            continue
    return records


def parse_torchrun(lines: Sequence[str]) -> tuple[dict[int, tuple[int, int]], set[int]]:
    """``{rank: (exit_code, pid)}`` from torchrun's failure summary, and the pids it closed."""
    failed: dict[int, tuple[int, int]] = {}
    closed: set[int] = set()
    rank: int | None = None
    for text in lines:
        if match := _TORCHRUN_CLOSING.search(text):
            closed.add(int(match.group(1)))
        elif match := _TORCHRUN_RANK.match(text):
            rank = int(match.group(1))
        elif (match := _TORCHRUN_EXIT.match(text)) and rank is not None:
            failed[rank] = (int(match.group(1)), int(match.group(2)))
            rank = None
    return failed, closed


def _task_ranks(spec: str) -> list[int]:
    ranks: list[int] = []
    for part in spec.split(","):
        first, _, last = part.partition("-")
        ranks += range(int(first), int(last or first) + 1)
    return ranks


def parse_srun(lines: Sequence[str]) -> dict[int, int]:
    """``{rank: exit_code}`` from srun's ``task N: Killed`` / ``Exited with exit code X`` lines."""
    failed = {}
    for text in lines:
        match = _SRUN_TASKS.search(text)
        if not match:
            continue
        code_match = re.search(r"exit code (\d+)", match.group(2))
        code = int(code_match.group(1)) if code_match else -signal.SIGKILL
        for rank in _task_ranks(match.group(1)):
            failed[rank] = code
    return failed


def failed_ranks(log_dir: Path, launcher_lines: Sequence[str]) -> list[RankFailure]:
    """Every rank known to have failed, the first failure first."""
    records = read_records(log_dir)
    torchrun, closed = parse_torchrun(launcher_lines)
    srun = parse_srun(launcher_lines)
    ranks = set(records) | set(torchrun) | set(srun)
    failures = []
    for rank in ranks:
        record = records.get(rank, {})
        code, pid = torchrun.get(rank, (srun.get(rank, 1 if record else None), record.get("pid")))
        failures.append(
            RankFailure(
                rank=rank,
                exit_code=code,
                pid=pid,
                error=record.get("error"),
                time=record.get("time"),
                stopped_by_launcher=pid in closed,
            )
        )
    return sorted(failures, key=lambda f: (f.group, f.time if f.time is not None else math.inf, f.rank))


def rank_log(log_dir: Path, rank: int) -> Path | None:
    """The newest per-rank log ``torchrun --redirects`` wrote for ``rank`` (stderr, else stdout)."""
    root = log_dir / "torchrun"
    for name in ("stderr.log", "stdout.log"):
        candidates = (
            [p for p in root.glob(f"*/attempt_*/{rank}/{name}") if p.stat().st_size > 0] if root.is_dir() else []
        )
        if candidates:
            return max(candidates, key=lambda p: p.stat().st_mtime)
    return None


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a text file."""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _rank_tail(log_dir: Path, rank: int) -> tuple[str, str]:
    """(where, text): the rank's own log, else its labelled lines in ``launch.log`` (srun)."""
    path = rank_log(log_dir, rank)
    if path is not None:
        return str(path), tail(path)
    launch = log_dir / LAUNCH_LOG
    if launch.is_file():
        prefixes = (f"[default{rank}]:", f"{rank}: ")
        lines = launch.read_text(errors="replace").splitlines()
        own = [line for line in lines if line.lstrip().startswith(prefixes)]
        if own:
            return f"{launch} (rank {rank}'s lines)", "\n".join(own[-TAIL_LINES:])
    return "", "(this rank printed nothing before it ended)"


def failure_report(log_dir: Path, exit_code: int, launcher_lines: Sequence[str] = ()) -> str:
    """What to print when the job failed: the first failing rank, its exit code and log tail, then
    the other failed ranks in one line each."""
    failures = failed_ranks(log_dir, launcher_lines)
    if not failures:
        out = [f"job failed with exit code {exit_code}; no rank reported a failure"]
        launcher = [line for line in launcher_lines if not is_rank_line(line)][-TAIL_LINES:]
        if launcher:
            out.append("--- last lines of the launcher ---\n" + "\n".join(launcher))
        return "\n".join(out)
    first, rest = failures[0], failures[1:]
    where, text = _rank_tail(log_dir, first.rank)
    out = [
        f"job failed with exit code {exit_code}: rank {first.rank} failed first ({first.how()})",
        f"--- rank {first.rank}: last lines of {where} ---" if where else f"--- rank {first.rank} ---",
        text,
    ]
    for other in rest:
        reason = (
            "then lost its peer"
            if other.lost_a_peer
            else ("then stopped by the launcher" if other.stopped_by_launcher else "then failed")
        )
        out.append(f"rank {other.rank}: {reason} ({other.how()})")
    out.append(f"full launcher output: {log_dir / LAUNCH_LOG}")
    return "\n".join(out)
