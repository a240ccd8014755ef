"""The supervisor with a stand-in launcher and ranks (``children/``): a stop signal reaches every
rank once (not the launcher, which then ends normally), a second one kills the job, ``srun`` mode
signals the launcher, nothing stays behind, silent start-up gets progress lines.

The signals are sent to this test process while ``supervise`` runs in it, exactly as a user's
signal reaches the harness; the end-to-end runs with torchrun are in ``functional_tests``.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from megatron.bridge.perf.harness import supervisor
from megatron.bridge.perf.harness.supervisor import LAUNCH_LOG, OutputPump, StopForwarder, alive, supervise

CHILDREN = Path(__file__).with_name("children")


@pytest.fixture
def markers(tmp_path):
    """Marker directory of the stand-ins; any of their processes still alive afterwards is killed
    (and fails the test that left it)."""
    path = tmp_path / "markers"
    path.mkdir()
    yield path
    pids = [int(p.read_text()) for p in path.glob("*.pid") if p.read_text().strip()]
    left = [pid for pid in pids if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"


def _launch(markers: Path, mode: str, target: str = "ranks", out=None):
    argv = [sys.executable, str(CHILDREN / "fake_launcher.py"), "2", mode, str(markers)]
    return supervise(argv, dict(os.environ), markers.parent / "log", target, out=out or io.StringIO())


def _signal_me(markers: Path, *signums: int, gap_s: float = 0.3) -> threading.Thread:
    """Once both stand-in ranks run, send ``signums`` to this process, ``gap_s`` apart."""

    def send():
        deadline = time.monotonic() + 30
        while len(list(markers.glob("rank*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        for signum in signums:
            os.kill(os.getpid(), signum)
            time.sleep(gap_s)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_stop_signal_reaches_each_rank_once_and_not_the_launcher(markers, signum):
    """SIGHUP too: a closed terminal stops the job the same way, and says so (it ended the harness
    silently before)."""
    _signal_me(markers, signum)
    out = io.StringIO()
    outcome = _launch(markers, "graceful", out=out)
    assert f"== {signal.Signals(signum).name} received: asking the ranks" in out.getvalue()
    assert outcome.stop_signal == signum and not outcome.killed
    assert outcome.exit_code == 0  # the launcher saw its ranks finish normally
    assert [(markers / f"rank{r}.stopped").read_text() for r in (0, 1)] == ["1", "1"]
    # each rank got SIGTERM and reports what the harness received (summary.json's stop_reason)
    assert [(markers / f"rank{r}.reason").read_text() for r in (0, 1)] == [signal.Signals(signum).name] * 2
    assert not (markers / "launcher.term").exists()
    assert outcome.leftovers_killed == 0


def test_the_same_signal_twice_at_once_is_one_request(markers):
    """A terminal's Ctrl-C under ``uv run`` arrives twice within milliseconds: still a clean stop."""
    _signal_me(markers, signal.SIGINT, signal.SIGINT, gap_s=0.05)
    outcome = _launch(markers, "graceful")
    assert outcome.stop_signal == signal.SIGINT and not outcome.killed and outcome.exit_code == 0
    assert [(markers / f"rank{r}.stopped").read_text() for r in (0, 1)] == ["1", "1"]


def test_second_signal_kills_the_job_at_once(markers):
    _signal_me(markers, signal.SIGTERM, signal.SIGINT, gap_s=supervisor.SAME_REQUEST_S + 0.3)
    out = io.StringIO()
    started = time.monotonic()
    outcome = _launch(markers, "stubborn", out=out)
    assert outcome.killed and outcome.stop_signal == signal.SIGTERM and outcome.kill_signal == signal.SIGINT
    assert time.monotonic() - started < 20
    assert (
        "== second signal (SIGINT): killing the job now, before the ranks have finished; checkpoint.save is "
        "not set: nothing was to be saved"
    ) in out.getvalue()
    assert not list(markers.glob("rank*.stopped"))


def test_a_second_signal_after_the_ranks_saved_does_not_say_without_saving(markers):
    """The ranks had saved and written summary.json and were exiting when the second Ctrl-C came:
    the harness kills them and says that the save was done, not that nothing was saved."""
    _signal_me(markers, signal.SIGINT, signal.SIGINT, gap_s=supervisor.SAME_REQUEST_S + 0.3)
    out = io.StringIO()
    outcome = _launch(markers, "saved", out=out)
    said = out.getvalue()
    assert outcome.killed and outcome.stop_signal == outcome.kill_signal == signal.SIGINT
    assert (
        "== second signal (SIGINT): the ranks had already saved and written summary.json; killing them as they exit"
    ) in said, said
    assert "without saving" not in said


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_srun_mode_sends_the_stop_to_the_launcher(markers, signum):
    """srun forwards SIGTERM to its tasks itself (the stand-in launcher does the same); the ranks
    report the signal the harness received."""
    _signal_me(markers, signum)
    outcome = _launch(markers, "graceful", target="launcher")
    assert (markers / "launcher.term").read_text() == "SIGTERM"
    assert [(markers / f"rank{r}.stopped").read_text() for r in (0, 1)] == ["1", "1"]
    assert [(markers / f"rank{r}.reason").read_text() for r in (0, 1)] == [signal.Signals(signum).name] * 2
    assert outcome.stop_signal == signum and outcome.exit_code == 0


def test_ranks_that_outlive_their_launcher_are_killed(markers):
    outcome = _launch(markers, "orphan")
    assert outcome.exit_code == 0 and outcome.leftovers_killed == 2


def test_signal_before_the_launcher_starts_launches_nothing(markers, monkeypatch):
    enter = StopForwarder.__enter__

    def enter_then_signal(self):
        entered = enter(self)
        os.kill(os.getpid(), signal.SIGTERM)
        return entered

    monkeypatch.setattr(StopForwarder, "__enter__", enter_then_signal)
    outcome = _launch(markers, "graceful")
    assert outcome.stop_signal == signal.SIGTERM and not list(markers.glob("*.pid"))


def test_progress_lines_while_the_ranks_are_silent(markers, monkeypatch):
    monkeypatch.setattr(supervisor, "PROGRESS_EVERY_S", 0.4)
    out = io.StringIO()
    outcome = _launch(markers, "slow", out=out)
    text = out.getvalue()
    assert outcome.exit_code == 0
    assert "ranks still starting" in text.split("[default")[0]  # before the first rank line
    assert text.count("ranks still starting") == text.split("iteration 1")[0].count("ranks still starting")
    assert (markers.parent / "log" / LAUNCH_LOG).read_text().count("[default") == 6


TORCHRUN_FAILURE = [
    "[default1]:training failed",
    "E1201 00:39:59.018000 10545 .venv/lib/python3.12/site-packages/torch/distributed/elastic/"
    "multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 10558)",
    "Traceback (most recent call last):",
    '  File "torch/distributed/run.py", line 1142, in <module>',
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "=======================================================",
    "  exitcode  : -9 (pid: 10558)",
    "=======================================================",
]
OTHER_TRACEBACK = ["Traceback (most recent call last):", '  File "x.py", line 1', "OSError: address in use"]


@pytest.mark.parametrize(
    "lines, verbose, shown",
    [
        (TORCHRUN_FAILURE, False, ["[default1]:training failed"]),
        (TORCHRUN_FAILURE, True, TORCHRUN_FAILURE),
        (OTHER_TRACEBACK, False, OTHER_TRACEBACK),
        (
            ["0: iteration 1", "srun: error: node1: task 1: Killed"],
            False,
            ["0: iteration 1", "srun: error: node1: task 1: Killed"],
        ),
    ],
    ids=["torchrun-failure-hidden", "verbose-shows-all", "other-traceback-shown", "srun-lines-shown"],
)
def test_console_drops_only_torchruns_own_failure_block(tmp_path, lines, verbose, shown):
    out = io.StringIO()
    pump = OutputPump(out, tmp_path / LAUNCH_LOG, verbose)
    for line in lines:
        pump.line(line)
    pump.close()
    assert out.getvalue().splitlines() == shown
    assert (tmp_path / LAUNCH_LOG).read_text().splitlines() == lines  # the log keeps everything


def test_a_full_disk_under_launch_log_is_one_line_and_the_console_goes_on(tmp_path):
    out = io.StringIO()
    pump = OutputPump(out, tmp_path / LAUNCH_LOG, verbose=False)
    pump.log.close()
    pump.log = open("/dev/full", "w")  # every write: No space left on device
    for i in range(3):
        pump.line(f"[default0]:iteration {i + 1}/3")
    pump.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(f"warning: cannot write {tmp_path / LAUNCH_LOG}: No space left on device")
    assert lines[1:] == [f"[default0]:iteration {i + 1}/3" for i in range(3)]
