"""``run_script.py`` as a user runs it, in its own process: read its output as it comes, signal it,
find its ranks, and check afterwards that none of its processes is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "performance" / "run_script.py"


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2 :].split()[1] == str(pid):
            found.append(int(entry))
    return found


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (launcher, ranks, their helpers)."""
    found, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        found += kids
        todo += kids
    return found


def running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def rank_pid(root: int, rank: int) -> int | None:
    """The training process of ``rank`` below ``root`` (from its environment)."""
    for pid in descendants(root):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if (
            b"megatron.bridge.training.entry" in cmd
            and b"loopback_torchrun" not in cmd
            and f"RANK={rank}".encode() in env
        ):
            return pid
    return None


class HarnessProcess:
    """One harness run; ``lines`` fills while it runs."""

    def __init__(self, *argv: str, env: dict | None = None, via_uv: bool = False) -> None:
        """``via_uv``: start it as users do, ``uv run python run_script.py ...``, in a session of its
        own, so that :meth:`press_ctrl_c` reaches uv and the harness together, as a terminal does."""
        command = ["uv", "run", "python", str(SCRIPT)] if via_uv else [sys.executable, str(SCRIPT)]
        self.proc = subprocess.Popen(
            [*command, *argv],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env or dict(os.environ),
            start_new_session=via_uv,
        )
        self.log_dir = Path(argv[argv.index("-l") + 1]) if "-l" in argv else None
        """The run directory (``-l``), where the ranks write ``summary.json``."""
        self.lines: list[str] = []
        self.seen: set[int] = set()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"never printed {text!r}:\n{self.output[-4000:]}")
            self.seen.update(descendants(self.proc.pid))
            time.sleep(0.05)
        self.seen.update(descendants(self.proc.pid))

    def send(self, signum: int) -> None:
        self.seen.update(descendants(self.proc.pid))
        self.proc.send_signal(signum)

    def press_ctrl_c(self) -> None:
        """SIGINT to the whole foreground process group (uv and the harness), like a terminal."""
        self.seen.update(descendants(self.proc.pid))
        os.killpg(self.proc.pid, signal.SIGINT)

    def finish(self, timeout: float = 300) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(10)
        return code

    def left_behind(self) -> list[int]:
        """Processes of this run still alive a moment after the harness exited (killed, then listed)."""
        time.sleep(0.5)
        left = [pid for pid in self.seen if running(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        return left
