"""The test suite's child launcher: a child that loses its free port to another process runs again
on another port; a child that fails for any other reason is not run again."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

CHILD = Path(__file__).parent / "children" / "listen_on_port.py"


def _launch_recording(ports: list[int]):
    def launch(port: int) -> dict:
        ports.append(port)
        return dict(args=[sys.executable, str(CHILD), str(port)])

    return launch


def test_a_child_whose_port_was_taken_runs_again_on_another(run_on_free_port) -> None:
    used: list[int] = []
    with socket.socket() as taken:  # another process's listener on the port the first launch gets
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        taken_port = taken.getsockname()[1]
        offered = iter([taken_port, 0])  # then port 0: the child's system picks a free one
        proc = run_on_free_port(
            _launch_recording(used), pick_port=lambda: next(offered), capture_output=True, text=True, timeout=60
        )
    assert proc.returncode == 0 and "listened" in proc.stdout
    assert used == [taken_port, 0]


def test_other_failures_are_not_run_again(run_on_free_port) -> None:
    used: list[int] = []

    def launch(port: int) -> dict:
        used.append(port)
        return dict(args=[sys.executable, "-c", "raise SystemExit('no such config file')"])

    proc = run_on_free_port(launch, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and len(used) == 1
